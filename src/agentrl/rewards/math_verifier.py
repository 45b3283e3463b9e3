"""Math and science answers: the recipe's strict box check, or a math-verify equivalence check.

``reward.math_mode``:

- ``strict`` (upstream, docs/recipe.md section 4; the paper preset and the embedded default): the
  last ``\\boxed{...}`` (brace-matched) in the last ``reward.strict_tail_chars`` (100)
  characters, compared with the ground truth by exact string equality; +1 if equal, else -1.
  ``1/2`` against ``\\frac{1}{2}`` scores -1. The embedded ``arith`` task has integer answers
  written the one way the generator writes them, so strict grading is faithful there and is
  the default; it is also what the paper's numbers were trained with.
- ``math_verify`` (a documented option, not upstream): the last ``\\boxed{...}`` anywhere in
  the response (the tail window is a guard of the exact match, not needed here), compared with
  Hugging Face's ``math-verify``: fractions, decimals, ``\\frac`` / ``\\dfrac``, ``\\text{}``,
  units, spacing, sets and intervals are compared as mathematical objects. Two guards around
  it: identical strings (after stripping ``$``, ``\\text{}`` wrappers, whitespace and case)
  are equal without parsing, and a ground truth that is a word rather than a formula (two or
  more letters in a row outside LaTeX commands, e.g. ``Paris``) is compared as a string only,
  because math-verify reads ``Paris`` as the product ``P*a*r*i*s`` and would accept ``Pairs``.

math-verify bounds its parsing time with ``signal.alarm``, which works only in the main
thread; elsewhere it runs without that bound (math-verify's own advice).
"""

from __future__ import annotations

import re
import threading
from typing import Any

from agentrl.config import RewardConfig
from agentrl.rewards.base import InvalidGroundTruthError, PendingVerdict, Verdict
from agentrl.rewards.boxed import last_boxed_content, strict_tail

MATH_VERIFY_TIMEOUT_S = 5
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{2,}")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")


def answer_string(ground_truth: Any, family: str) -> str:
    """The ground truth as the string it is compared with; numbers are accepted as their str()."""
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int, float)):
        raise InvalidGroundTruthError(
            f"{family} ground truth must be a short answer string, got {type(ground_truth).__name__}: "
            f"{str(ground_truth)[:80]!r}"
        )
    return str(ground_truth)


def normalize_text_answer(text: str) -> str:
    """Spelling-level normalization for string comparison (not mathematical equivalence)."""
    previous = None
    while previous != text:  # nested wrappers: \text{\textbf{B}}
        previous, text = text, _TEXT_WRAPPER.sub(r"\1", text)
    text = text.replace("$", "").replace("\\,", "").replace("\\ ", " ").replace("\\!", "")
    text = " ".join(text.split()).strip().rstrip(".").strip()
    return text.lower()


def is_word_answer(ground_truth: str) -> bool:
    """True for answers such as ``Paris`` or ``\\text{benzene}``, which must not be read as products."""
    return bool(_WORD.search(_LATEX_COMMAND.sub(" ", ground_truth)))


def _math_verify_equal(ground_truth: str, pred: str) -> bool:
    from math_verify import parse, verify  # imported lazily: sympy costs a second at import

    bound = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=bound)
    target = parse(f"\\boxed{{{pred}}}", parsing_timeout=bound)
    if not gold or not target:
        return False
    return bool(verify(gold, target, timeout_seconds=bound))


class MathVerifier:
    """Grades ``\\boxed{}`` answers of math and science problems; see the module docstring."""

    family = "math"

    def __init__(self, cfg: RewardConfig):
        self.mode = cfg.math_mode
        self.tail_chars = cfg.strict_tail_chars

    def prepare(self, response: str, ground_truth: Any) -> PendingVerdict:
        return PendingVerdict.ready(self.verdict(response, answer_string(ground_truth, self.family)))

    def verdict(self, response: str, ground_truth: str) -> Verdict:
        if self.mode == "strict":
            pred = last_boxed_content(strict_tail(response, self.tail_chars))
            correct = pred is not None and pred == ground_truth
            how = "exact"
        else:
            pred = last_boxed_content(response)
            correct, how = self._equivalent(ground_truth, pred)
        details = {"mode": self.mode, "matched_by": how if correct else None}
        return Verdict(score=1.0 if correct else -1.0, acc=correct, pred=pred, details=details)

    @staticmethod
    def _equivalent(ground_truth: str, pred: str | None) -> tuple[bool, str]:
        if pred is None:
            return False, "none"
        if normalize_text_answer(pred) == normalize_text_answer(ground_truth):
            return True, "string"
        if is_word_answer(ground_truth):
            return False, "string"
        return _math_verify_equal(ground_truth, pred), "math_verify"
