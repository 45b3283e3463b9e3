"""Types shared by the verifiers: the verdict of one verifier, the final reward, and the
two-phase verifier protocol that lets code grading of many responses share one sandbox pool.

A verifier's :meth:`Verifier.prepare` turns ``(response, ground truth)`` into a
:class:`PendingVerdict`: the programs it needs run (none for math and multiple choice) and a
function that turns their results into a :class:`Verdict`. The reward function gathers the
programs of a whole batch, runs them in one ``Sandbox.run_many`` call, and hands each verifier
its slice back, so the cases of many responses run concurrently.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agentrl.errors import UserInputError

if TYPE_CHECKING:  # the sandbox module is only needed for the type of the results
    from agentrl.tools.sandbox import ExecutionResult


class InvalidGroundTruthError(UserInputError):
    """A ground truth a verifier cannot grade against (wrong type or shape); says what it expected.

    ``upstream_score``: the raw score upstream's grader gives it (``reward.invalid_ground_truth:
    score``): -1 where its ``compute_score`` catches an exception, 0.0 where SandboxFusion's
    ``check_correctness`` marks every case failed without raising (input and output counts differ).
    """

    def __init__(self, message: str, upstream_score: float = -1.0) -> None:
        super().__init__(message)
        self.upstream_score = upstream_score


@dataclass(frozen=True)
class Verdict:
    """What a verifier says about one response, before shaping."""

    score: float
    acc: bool
    pred: str | None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardResult:
    """The reward of one response: ``score`` after shaping; ``details`` says how it was reached.

    ``details`` holds at least ``family``, ``raw_score`` (the verifier's score),
    ``tool_shaping`` (what tool-call shaping added) and ``overlong_penalty`` (<= 0); code
    rewards add ``cases_passed`` and ``cases_total``.
    """

    score: float
    acc: bool
    pred: str | None
    details: dict[str, Any]
    # The sandbox lost one of its code test cases twice (run, then rerun): the score is not the
    # response's, and the stages leave its trajectory out as they do one whose tool call was lost.
    infra_failure: bool = False

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable dict (``json.dumps`` of it never fails)."""
        return json.loads(json.dumps(asdict(self), default=str))


# Programs for the sandbox: (source code, stdin or None).
Job = tuple[str, "str | None"]


@dataclass(frozen=True)
class PendingVerdict:
    """The programs a verdict depends on, and how to turn their results into the verdict."""

    jobs: Sequence[Job]
    finish: Callable[[Sequence[ExecutionResult]], Verdict]

    @classmethod
    def ready(cls, verdict: Verdict) -> PendingVerdict:
        """A verdict that needs no program run (math, multiple choice, code that does not parse)."""
        return cls(jobs=(), finish=lambda _results: verdict)


class Verifier(Protocol):
    family: str

    def prepare(self, response: str, ground_truth: Any) -> PendingVerdict: ...
