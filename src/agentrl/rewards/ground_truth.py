"""Ground truths a row's verifier can grade, checked when the data is prepared and when a grading
stage (scoring, GRPO, evaluation) reads it, so a bad row is refused naming its file, row and
column before any rollout rather than found mid-run when its verifier raises.

The checks every verifier shares (a non-empty prompt and answer, code tests with an output per
input) are :func:`agentrl.data.records.problem_fault`'s, applied to any problem file read; the
ones that need the row's verifier family (the routing of :mod:`agentrl.rewards.registry`) are
here, above the records, so the record layer imports no verifier.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentrl.data.records import Problem, read_problems
from agentrl.errors import DataFormatError
from agentrl.rewards.choice_verifier import choice_ground_truth_fault
from agentrl.rewards.registry import family_of


def ground_truth_fault(problem: Problem) -> str | None:
    """What makes ``problem``'s ground truth ungradable by its family's verifier, else None
    (multiple choice: one option letter among those the prompt offers). A source no rule routes
    is graded as math, which needs nothing more than the shared checks."""
    if family_of(problem.data_source, unknown="math") != "multiple_choice":
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
