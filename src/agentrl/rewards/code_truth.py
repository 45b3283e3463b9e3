"""How a code row's ground truth becomes the dict of its tests (``reward.code_ground_truth``).

- ``json`` (the project's rule): a string is decoded as JSON, a dict is taken as it is.
- ``literal_eval`` (upstream; the as-released overlay): as verl's ``code_math.compute_score`` and
  SandboxFusion's ``check_correctness`` read it (``verl/utils/reward_score/livecodebench/code_math.py``,
  ``verl/utils/reward_score/sandbox_fusion/utils.py``). The row keeps the text its file stores
  (prepare-data does not decode it) and code_math routes on ``str()`` of it: a text holding
  ``import_prefix`` is a LeetCode harness read with ``json.loads``; one holding ``inputs`` goes to
  check_correctness, which reads the whole text with ``ast.literal_eval``; any other is graded as
  a boxed math answer against the text (:func:`boxed_text_verdict`).

literal_eval is not JSON. A bare ``true``, ``false`` or ``null`` is no Python literal: the row
scores -1 (-1.1 after the released shaping) for every answer, so its group has zero advantage and
it is never learned. ``\\/`` stays a backslash and a slash, and a surrogate pair
``\\ud83d\\ude00`` stays two code points, so an expected output holding either never equals what
a program prints (an input holding a pair reaches the program whole: the request to SandboxFusion
is JSON, :func:`as_sent`). A text without ``outputs`` is check_correctness's ``[-1]`` (0.0).
Before that, code_math tests ``"fn_name" in`` the JSON decoding of the text (the text itself when
it is not JSON) and then indexes it: on anything but a JSON object that raises (-1) unless the
answer holds ``class Solution``, which skips the rewrite (:attr:`CodeTruth.class_solution_only`).
"""

from __future__ import annotations

import ast
import json
import threading
import warnings
from dataclasses import dataclass
from typing import Any

from agentrl.rewards.base import InvalidGroundTruthError, Verdict
from agentrl.rewards.boxed import last_boxed_content

MATH_VERIFY_TIMEOUT_S = 5  # code_math's parsing_timeout and timeout_seconds
LEETCODE_KEYS = ("import_prefix", "test_code", "entry_point")


@dataclass(frozen=True)
class CodeTruth:
    tests: dict[str, Any]
    # Why only an answer holding the text "class Solution" is run (code_math's rewrite would
    # raise or find no function), or None.
    class_solution_only: str | None = None


def ground_truth_text(ground_truth: Any) -> str:
    """What code_math reads: ``str(test_cases)`` (a dict's Python repr, which literal_eval reads back)."""
    return ground_truth if isinstance(ground_truth, str) else str(ground_truth)


def is_boxed_route(ground_truth: Any) -> bool:
    """code_math grades a text with neither ``import_prefix`` nor ``inputs`` as a boxed math answer."""
    text = ground_truth_text(ground_truth)
    return "import_prefix" not in text and "inputs" not in text


def read_code_truth(ground_truth: Any, reading: str = "json") -> CodeTruth:
    """The tests' dict of a code ground truth read as ``reward.code_ground_truth`` says; an
    InvalidGroundTruthError carries the score upstream gives the row (``upstream_score``)."""
    if reading == "json":
        if isinstance(ground_truth, str):
            try:
                ground_truth = json.loads(ground_truth)
            except json.JSONDecodeError as exc:
                raise InvalidGroundTruthError(f"code ground truth is a string but not JSON: {exc}") from None
        if not isinstance(ground_truth, dict):
            raise InvalidGroundTruthError(f"code ground truth must be a dict, got {type(ground_truth).__name__}")
        return CodeTruth(ground_truth)
    text = ground_truth_text(ground_truth)
    if "import_prefix" in text:  # code_math's LeetCode branch: json.loads, then test_cases[key]
        try:
            tests = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidGroundTruthError(f"code ground truth holds import_prefix but is not JSON: {exc}") from None
        if not isinstance(tests, dict) or not set(LEETCODE_KEYS) <= tests.keys():
            raise InvalidGroundTruthError(
                f"code ground truth holds import_prefix but not the keys {list(LEETCODE_KEYS)}"
            )
        return CodeTruth(tests)
    if "outputs" not in text:
        raise InvalidGroundTruthError("code ground truth holds 'inputs' but not 'outputs'", upstream_score=0.0)
    tests = _literal(text, "code ground truth")
    if not isinstance(tests, dict) or not {"inputs", "outputs"} <= tests.keys():
        raise InvalidGroundTruthError(
            f"code ground truth read with ast.literal_eval is a {type(tests).__name__} without the keys inputs, outputs"
        )
    return CodeTruth(tests, _fn_name_guard(text))


def _literal(text: str, what: str) -> Any:
    with warnings.catch_warnings():  # "\/" is an invalid escape to Python: a warning, kept as two characters
        warnings.simplefilter("ignore")
        try:
            return ast.literal_eval(text)
        except Exception as exc:  # noqa: BLE001 - ValueError, SyntaxError, TypeError, MemoryError, RecursionError
            raise InvalidGroundTruthError(
                f"{what} is not a Python literal, as ast.literal_eval reads it: {type(exc).__name__}: {exc}"
            ) from None


def _fn_name_guard(text: str) -> str | None:
    """code_math's ``"fn_name" in input_output`` then ``input_output["fn_name"]``, where
    input_output is the JSON decoding of the text or, when that fails, the text."""
    try:
        view: Any = json.loads(text)
    except json.JSONDecodeError:
        view = text
    if isinstance(view, dict) or not isinstance(view, str | list) or "fn_name" not in view:
        return None  # a JSON object: the rewrite reads its fn_name (the one literal_eval reads too)
    return "no_entry_point: code_math indexes a ground truth that is not a JSON object with 'fn_name'"


def case_list(value: Any, key: str) -> Any:
    """A list of cases, or its string spelling (``check_correctness`` reads it with ``ast.literal_eval``)."""
    if not isinstance(value, str):
        return list(value) if isinstance(value, tuple) else value
    cases = _literal(value, f"code ground truth {key!r} is a string but")
    return list(cases) if isinstance(cases, tuple) else cases


def as_sent(text: str) -> str:
    """A string as SandboxFusion receives it: inside a JSON request (``requests``' ``json.dumps``,
    ASCII escapes), so two code points of a surrogate pair arrive as the one character they spell."""
    return json.loads(json.dumps(text))


def boxed_text_verdict(response: str, text: str) -> Verdict:
    """code_math's math branch for a code text with neither ``import_prefix`` nor ``inputs``: the
    last ``\\boxed{}`` of the answer (after the first ``</think>``) parsed by math-verify, equal
    to the text as a string or as mathematics: 1, else -1."""
    from math_verify import parse, verify  # imported lazily: sympy costs a second at import

    if "</think>" in response:
        response = response.split("</think>")[1]
    content = last_boxed_content(response)
    bound = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    correct, pred = False, None
    try:
        parsed = parse(None if content is None else f"\\boxed{{{content}}}", parsing_timeout=bound)
    except Exception:  # noqa: BLE001 - code_math's handler: -1
        parsed = []
    if len(parsed) >= 2:
        pred = parsed[1]
        correct = pred == text
        if not correct:
            try:
                correct = bool(
                    verify(parse(f"\\boxed{{{text}}}", parsing_timeout=bound), parsed, timeout_seconds=bound)
                )
            except Exception:  # noqa: BLE001 - code_math skips a ground truth that fails to verify
                correct = False
    details = {"route": "boxed", "boxed": content}
    return Verdict(score=1.0 if correct else -1.0, acc=correct, pred=pred, details=details)
