"""Ground truths a row's verifier can grade, checked when the data is prepared and when a grading
stage (scoring, GRPO, evaluation) reads it, so a bad row is refused naming its file, row and
column before any rollout rather than found mid-run when its verifier raises.

The checks every verifier shares (a non-empty prompt and answer, code tests with an output per
input) are :func:`agentrl.data.records.problem_fault`'s, applied to any problem file read; the
ones that need the row's verifier family (the routing of :mod:`agentrl.rewards.registry`) are
here, above the records, so the record layer imports no verifier.

With ``reward.invalid_ground_truth: score`` (the as-released overlay) prepare-data keeps the rows
these checks refuse, as upstream trains on them and grades them (-1, shaped, or 0.0 for a test
count mismatch): :func:`checked_problems` marks each with what was found
(:data:`agentrl.data.records.KEPT_AS_RELEASED`) and counts them by kind for its log, and the
stages that read the file take a marked row as it is.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from agentrl.config import RewardConfig
from agentrl.data.records import KEPT_AS_RELEASED, Problem, problem_fault, read_problems
from agentrl.errors import DataFormatError
from agentrl.rewards.base import InvalidGroundTruthError
from agentrl.rewards.choice_verifier import choice_ground_truth_fault
from agentrl.rewards.code_truth import is_boxed_route
from agentrl.rewards.code_verifier import parse_code_tests
from agentrl.rewards.registry import family_of


def ground_truth_fault(problem: Problem) -> str | None:
    """What makes ``problem``'s ground truth ungradable by its family's verifier, else None
    (multiple choice: one option letter among those the prompt offers). A source no rule routes
    is graded as math, which needs nothing more than the shared checks."""
    if problem.extra.get(KEPT_AS_RELEASED) or family_of(problem.data_source, unknown="math") != "multiple_choice":
        return None
    users = [m.get("content") for m in problem.prompt if m.get("role") == "user"]
    return choice_ground_truth_fault(problem.ground_truth, "\n".join(c for c in users if isinstance(c, str)))


def check_ground_truths(problems: Sequence[Problem], what: str) -> list[Problem]:
    """``problems`` unchanged, or DataFormatError naming ``what``, the first bad row and its column."""
    for index, problem in enumerate(problems):
        fault = ground_truth_fault(problem)
        if fault is not None:
            raise DataFormatError(f"{what}: row {index} (id {problem.id!r}), column 'ground_truth': {fault}")
    return list(problems)


def read_gradable_problems(path: str | Path) -> list[Problem]:
    """:func:`agentrl.data.records.read_problems`, then every row's ground truth checked for its verifier."""
    return check_ground_truths(read_problems(path), str(path))


def code_ground_truth_fault(problem: Problem, reward: RewardConfig) -> str | None:
    """Why the code verifier cannot build tests from ``problem``'s ground truth under ``reward``'s
    reading (``reward.code_ground_truth`` and the test keys), else None; None for other families."""
    if family_of(problem.data_source, unknown="math") != "code":
        return None
    if reward.code_ground_truth == "literal_eval" and is_boxed_route(problem.ground_truth):
        return "neither import_prefix nor inputs in the text: code_math grades it as a boxed math answer"
    try:
        parse_code_tests(
            problem.ground_truth,
            reward.functional_tests,
            reward.stdio_tests,
            reward.code_ground_truth,
            reward.empty_fn_name,
        )
    except InvalidGroundTruthError as exc:
        return str(exc)
    return None


def checked_problems(
    problems: Sequence[Problem], what: str, reward: RewardConfig
) -> tuple[list[Problem], dict[str, int]]:
    """prepare-data's check of every row (``what`` names the set in errors): a prompt fault is a
    DataFormatError naming the row and column; a ground truth the checks refuse (the shared ones,
    its family's, the code tests its verifier would build) is one too under
    ``reward.invalid_ground_truth: error``, and under ``score`` the row is kept, marked with the
    finding. Returns the rows and the count of kept ones by kind of finding."""
    checked, kinds = [], Counter()
    for index, problem in enumerate(problems):
        fault = problem_fault(problem)
        if fault is not None and fault[0] != "ground_truth":
            raise DataFormatError(f"{what}: row {index} (id {problem.id!r}), column '{fault[0]}': {fault[1]}")
        finding = fault[1] if fault else ground_truth_fault(problem) or code_ground_truth_fault(problem, reward)
        if finding is None:
            checked.append(problem)
        elif reward.invalid_ground_truth == "score":
            checked.append(dataclasses.replace(problem, extra={**problem.extra, KEPT_AS_RELEASED: finding}))
            kinds[finding_kind(finding)] += 1
        else:
            raise DataFormatError(f"{what}: row {index} (id {problem.id!r}), column 'ground_truth': {finding}")
    return checked, dict(kinds)


def finding_kind(finding: str) -> str:
    """A finding without its row's particulars (numbers, quoted values, the detail after ': '),
    so the log counts kept rows by kind."""
    head = finding.split(": ")[0]
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'…'", head))[:120]
