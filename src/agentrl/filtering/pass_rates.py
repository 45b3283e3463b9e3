"""The pass-rate table: one row per RL-pool problem, from the SFT model's k graded rollouts.

Columns: ``id``, ``data_source``, ``family`` and ``level`` (from the problem's ``extra`` when it
has them: the embedded task does, the upstream pool does not), ``k`` (rollouts), ``correct``,
``pass_rate`` (= correct / k), ``mean_score`` (shaped reward, as RL would see it),
``mean_tool_calls``, ``mean_response_length`` (response tokens including tool responses, the
length the RL response budget counts).

A sample left out for an infrastructure failure (``infra_failed``: the sandbox lost a tool call
of its retry too, :mod:`agentrl.tools.health`) is not a failure of the model: the row's numbers
are over the other samples and ``k`` counts those; a problem whose samples were all lost has no
row (logged).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from agentrl.data.records import Problem, read_parquet, write_parquet
from agentrl.filtering.selection import check_pass_rate_table
from agentrl.tools.health import valid_rows

log = logging.getLogger("agentrl.filter")

COLUMNS = (
    "id",
    "data_source",
    "family",
    "level",
    "k",
    "correct",
    "pass_rate",
    "mean_score",
    "mean_tool_calls",
    "mean_response_length",
)


def pass_rate_table(problems: Sequence[Problem], rows: Sequence[Mapping[str, Any]], k: int) -> pd.DataFrame:
    """Aggregate sample rows (``agentrl.sampling.samples.sample_row``) into the table, in problem order.

    Every problem must have exactly ``k`` rows; a missing or extra sample means a broken run,
    and a pass rate over another k would not be comparable.
    """
    by_problem: dict[str, list[Mapping[str, Any]]] = {p.id: [] for p in problems}
    for number, row in enumerate(rows):
        if row["problem_id"] not in by_problem:
            raise ValueError(f"sample row {number} is for problem {row['problem_id']!r}, which is not in the pool")
        by_problem[row["problem_id"]].append(row)
    records = []
    for problem in problems:
        samples = by_problem[problem.id]
        if len(samples) != k:
            raise ValueError(f"problem {problem.id!r} has {len(samples)} scored samples, expected k = {k}")
        samples = valid_rows(samples)
        if not samples:
            log.warning("problem %r: every sample lost a tool call to the sandbox; it gets no pass rate", problem.id)
            continue
        correct = sum(bool(s["acc"]) for s in samples)
        level = problem.extra.get("level")
        records.append(
            {
                "id": problem.id,
                "data_source": problem.data_source,
                "family": problem.extra.get("family"),
                "level": int(level) if isinstance(level, (int, float)) and not isinstance(level, bool) else None,
                "k": len(samples),
                "correct": correct,
                "pass_rate": correct / len(samples),
                "mean_score": sum(float(s["score"]) for s in samples) / len(samples),
                "mean_tool_calls": sum(int(s["tool_calls"]) for s in samples) / len(samples),
                "mean_response_length": sum(int(s["response_length"]) for s in samples) / len(samples),
            }
        )
    table = pd.DataFrame.from_records(records, columns=list(COLUMNS))
    table["level"] = table["level"].astype("Int64")  # nullable: the upstream pool has no levels
    return table


def write_pass_rates(table: pd.DataFrame, path: str | Path) -> None:
    write_parquet(table, path)


def read_pass_rates(path: str | Path) -> pd.DataFrame:
    table = read_parquet(path, "pass-rate table")
    check_pass_rate_table(table, str(path))
    return table
