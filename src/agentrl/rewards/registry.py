"""Which verifier grades which data source: two small tables a user can extend.

- ``SOURCE_RULES``: ordered ``(pattern, family)`` rules; the first whose shell-style pattern
  (``fnmatch``, case-insensitive) matches the lower-cased ``data_source`` wins. Built-in rules
  follow upstream: any source containing ``code`` is code (upstream's own test, covering
  ``LiveCodeBench_v6``, ``train-code-*`` and ``embedded-code``); ``gpqa*`` and
  ``embedded-choice`` are multiple choice; ``math_dapo``, ``mega-science``, ``train-math-*``,
  ``aime*`` and ``embedded-arith`` are math. Rules added with :func:`register_source` are
  tried before the built-in ones, so a user can also override them.
- ``VERIFIER_FACTORIES``: family -> a callable building the verifier from ``RewardConfig``;
  :func:`register_verifier` adds a family.

An unknown source is an error (:class:`UnknownDataSourceError`), never a silent zero reward:
a typo in a data file would otherwise train on a constant reward without anyone noticing.
``prepare-data`` routes every row when the data is prepared, so the error comes before any
rollout. ``reward.unknown_source: math`` is upstream's rule instead (its ``compute_score``
grades every source without ``code`` as strict-box math); the paper presets use it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass

from agentrl.config import RewardConfig
from agentrl.errors import UserInputError
from agentrl.rewards.base import Verifier
from agentrl.rewards.choice_verifier import ChoiceVerifier
from agentrl.rewards.code_verifier import CodeVerifier
from agentrl.rewards.math_verifier import MathVerifier


class UnknownDataSourceError(UserInputError):
    """No routing rule matches a data source; the message names it and the known families."""


@dataclass(frozen=True)
class SourceRule:
    pattern: str  # fnmatch pattern, matched against the lower-cased data_source
    family: str


VerifierFactory = Callable[[RewardConfig], Verifier]

VERIFIER_FACTORIES: dict[str, VerifierFactory] = {
    "math": MathVerifier,
    "multiple_choice": ChoiceVerifier,
    "code": CodeVerifier,
}

BUILTIN_SOURCE_RULES: tuple[SourceRule, ...] = (
    SourceRule("*code*", "code"),
    SourceRule("gpqa*", "multiple_choice"),
    SourceRule("embedded-choice", "multiple_choice"),
    SourceRule("math_dapo", "math"),
    SourceRule("mega-science", "math"),
    SourceRule("train-math-*", "math"),
    SourceRule("aime*", "math"),
    SourceRule("embedded-arith", "math"),
)

_USER_SOURCE_RULES: list[SourceRule] = []


def source_rules() -> tuple[SourceRule, ...]:
    """The rules in the order they are tried: user-registered first, then the built-ins."""
    return (*_USER_SOURCE_RULES, *BUILTIN_SOURCE_RULES)


def register_verifier(family: str, factory: VerifierFactory) -> None:
    """Add (or replace) the verifier of a family."""
    VERIFIER_FACTORIES[family] = factory


def register_source(pattern: str, family: str) -> None:
    """Route data sources matching ``pattern`` (fnmatch, case-insensitive) to ``family``."""
    if family not in VERIFIER_FACTORIES:
        raise UnknownDataSourceError(
            f"cannot route {pattern!r} to family {family!r}: no verifier registered for it; "
            f"known families: {sorted(VERIFIER_FACTORIES)}"
        )
    _USER_SOURCE_RULES.insert(0, SourceRule(pattern.lower(), family))


def unregister_source(pattern: str) -> None:
    """Remove the user rules for ``pattern`` (built-in rules cannot be removed, only overridden)."""
    _USER_SOURCE_RULES[:] = [rule for rule in _USER_SOURCE_RULES if rule.pattern != pattern.lower()]


def family_of(data_source: str, unknown: str = "error") -> str:
    """The verifier family of a data source: ``'math'``, ``'multiple_choice'`` or ``'code'``.

    ``unknown`` is ``reward.unknown_source``: ``"error"`` raises for a source no rule matches,
    ``"math"`` grades it as math (upstream).
    """
    name = str(data_source).lower()
    for rule in source_rules():
        if fnmatch.fnmatchcase(name, rule.pattern):
            return rule.family
    if unknown == "math":
        return "math"
    raise UnknownDataSourceError(
        f"no reward verifier for data_source {data_source!r}; known families: {sorted(VERIFIER_FACTORIES)}; "
        f"routing patterns (first match wins): {[f'{r.pattern} -> {r.family}' for r in source_rules()]}; "
        "add one with agentrl.rewards.register_source(pattern, family)"
    )
