"""Multiple choice (GPQA-Diamond, the embedded ``choice`` task): the boxed option letter.

``reward.choice_mode: exact`` is upstream: GPQA is graded with the same strict box check as
math, the last ``\\boxed{...}`` in the last 100 characters must equal the ground truth's text
exactly, so ``\\boxed{(B)}`` or ``\\boxed{b}`` score -1 (the paper presets); a ground truth that
is no letter among the options (kept by the as-released overlay) is compared the same way.
``choice_mode: letter`` (the embedded default) is a deliberate departure: the box's content is
reduced to a letter first, tolerating
``\\boxed{B}``, ``\\boxed{(B)}``, ``\\boxed{\\text{B}}``, ``\\boxed{\\textbf{B}}``,
``\\boxed{B.}``, ``\\boxed{[B]}`` and lower case, because the prompt asks for "the final
uppercase letter option" and a wrapper around the right letter is not a wrong answer. Anything
that does not reduce to a single letter (``\\boxed{B or C}``, ``\\boxed{42}``) is wrong. The
search window stays upstream's tail of ``reward.strict_tail_chars`` characters.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.config import RewardConfig
from agentrl.rewards.base import InvalidGroundTruthError, PendingVerdict, Verdict
from agentrl.rewards.boxed import last_boxed_content, strict_tail
from agentrl.rewards.math_verifier import answer_string

_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mathbf|mathit|textrm)\s*\{(.*)\}$", re.DOTALL)
_BRACKETS = (("(", ")"), ("[", "]"), ("{", "}"))


def option_letter(text: str) -> str | None:
    """The option letter ``text`` spells (``(b)`` -> ``B``), or None if it is not one letter."""
    previous = None
    while previous != text:
        previous = text
        text = text.strip().replace("$", "").rstrip(".").strip()
        wrapped = _WRAPPER.match(text)
        if wrapped:
            text = wrapped.group(1)
        for opening, closing in _BRACKETS:
            if len(text) >= 2 and text[0] == opening and text[-1] == closing:
                text = text[1:-1]
    if len(text) == 1 and text.isascii() and text.isalpha():
        return text.upper()
    return None


def ground_truth_letter(ground_truth: Any) -> str:
    letter = option_letter(ground_truth) if isinstance(ground_truth, str) else None
    if letter is None:
        raise InvalidGroundTruthError(
            f"multiple_choice ground truth must be a single option letter such as 'B', got {ground_truth!r}"
        )
    return letter


# How prompts label their options: lines "A) text" or "(A) text" (GPQA), or "A=-26, B=-21" (embedded choice).
_LINE_LABEL = re.compile(r"^[ \t]*\(?([A-Z])\)", re.MULTILINE)
_PAIR_LABEL = re.compile(r"(?:^|,[ \t]*)([A-Z])=", re.MULTILINE)


def offered_letters(prompt_text: str) -> str:
    """The option letters a prompt offers: the run ``A``, ``B``, ... of letters it labels as
    options, stopping at the first one missing ("ABCD"), or "" when it labels none."""
    labelled = set(_LINE_LABEL.findall(prompt_text)) | set(_PAIR_LABEL.findall(prompt_text))
    offered = ""
    while chr(ord("A") + len(offered)) in labelled:
        offered += chr(ord("A") + len(offered))
    return offered


def choice_ground_truth_fault(ground_truth: Any, prompt_text: str) -> str | None:
    """What makes ``ground_truth`` ungradable by this verifier for a row whose prompt is
    ``prompt_text``: not one option letter, or a letter the prompt offers no option for. None if fine."""
    try:
        letter = ground_truth_letter(ground_truth)
    except InvalidGroundTruthError as exc:
        return str(exc)
    offered = offered_letters(prompt_text)
    if offered and letter not in offered:
        return f"option letter {letter!r} is not one of the prompt's options ({', '.join(offered)})"
    return None


class ChoiceVerifier:
    family = "multiple_choice"

    def __init__(self, cfg: RewardConfig):
        self.tail_chars = cfg.strict_tail_chars
        self.mode = cfg.choice_mode

    def prepare(self, response: str, ground_truth: Any) -> PendingVerdict:
        # exact is math_dapo's strict box: the box must equal the ground truth's text, whatever it
        # holds (a letter without an option, an empty answer: rows the as-released overlay keeps)
        expected = (
            answer_string(ground_truth, self.family) if self.mode == "exact" else ground_truth_letter(ground_truth)
        )
        boxed = last_boxed_content(strict_tail(response, self.tail_chars))
        if self.mode == "exact":
            letter = boxed if boxed is not None and boxed == expected else None
        else:
            letter = option_letter(boxed) if boxed is not None else None
        correct = letter == expected
        verdict = Verdict(
            score=1.0 if correct else -1.0,
            acc=correct,
            pred=letter if letter is not None else boxed,
            details={"boxed": boxed, "expected": expected, "mode": self.mode},
        )
        return PendingVerdict.ready(verdict)
