"""The report's tool-health section: did the tools work, what failed and why.

Every tool call of every stage has one outcome (:data:`agentrl.tools.sandbox.OUTCOMES`): the
model's own (``ok``, ``parse_failure``, ``program_error``, ``program_timeout``) or the sandbox's
(``infra_failure``). The table has one row per evaluated (model, benchmark), from the
``tool_health`` block of its ``metrics.json``, and one row for GRPO's rollouts, from the
``tool_health/`` keys of ``results/rl/metrics.jsonl`` (shares weighted by each step's calls,
latency p50 the median and p95 the largest of the steps'); the plot draws GRPO's shares and
latencies over the steps. A run whose sandbox was broken shows a large ``infra_failure`` share
and ``left out`` counts here (the stage stops past ``sandbox.max_infra_failure_share``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from agentrl.report.tables import EvalResult, markdown_table
from agentrl.tools.sandbox import OUTCOMES

PREFIX = "tool_health/"
COLUMNS = (
    "stage",
    "benchmark",
    "calls",
    "calls_per_trajectory",
    *(f"{o}_pct" for o in OUTCOMES),
    "retried",
    "left_out",
    "problems_left_out",
    "queue_p95_s",
    "run_p50_s",
    "run_p95_s",
)


def _pct(value: float | None) -> float | None:
    return None if value is None else 100.0 * float(value)


def _count(value: float | None) -> int | None:
    return None if value is None else int(value)


def eval_health_row(result: EvalResult) -> dict[str, Any]:
    """One evaluated (model, benchmark); ``None`` cells for a metrics.json written before tool health."""
    health: Mapping[str, Any] = result.metrics.get("tool_health") or {}
    return {
        "stage": f"evaluate {result.label}",
        "benchmark": result.benchmark,
        "calls": _count(health.get("calls")),
        "calls_per_trajectory": health.get("calls_per_trajectory"),
        **{f"{o}_pct": _pct(health.get(f"share/{o}")) for o in OUTCOMES},
        "retried": _count(health.get("retried")),
        "left_out": _count(health.get("infra_excluded")),
        "problems_left_out": _count(health.get("problems_left_out")),
        "queue_p95_s": None,  # measured per shard, in the stage log
        "run_p50_s": None,
        "run_p95_s": None,
    }


def grpo_health_row(rows: Sequence[Mapping[str, float]]) -> dict[str, Any] | None:
    """GRPO's rollouts over all logged steps (``None`` for a log without ``tool_health/`` keys)."""
    steps = [r for r in rows if f"{PREFIX}calls" in r]
    if not steps:
        return None
    calls = sum(r[f"{PREFIX}calls"] for r in steps)
    trajectories = sum(
        r[f"{PREFIX}calls"] / r[f"{PREFIX}calls_per_trajectory"] for r in steps if r[f"{PREFIX}calls_per_trajectory"]
    )

    def share(outcome: str) -> float | None:
        weighted = sum(r[f"{PREFIX}share/{outcome}"] * r[f"{PREFIX}calls"] for r in steps)
        return 100.0 * weighted / calls if calls else None

    run_p50 = sorted(r[f"{PREFIX}run_s_p50"] for r in steps)[len(steps) // 2]
    return {
        "stage": "grpo rollouts",
        "benchmark": f"{len(steps)} steps",
        "calls": int(calls),
        "calls_per_trajectory": calls / trajectories if trajectories else 0.0,
        **{f"{o}_pct": share(o) for o in OUTCOMES},
        "retried": int(sum(r[f"{PREFIX}retried"] for r in steps)),
        "left_out": int(sum(r[f"{PREFIX}infra_excluded"] for r in steps)),
        "problems_left_out": None,
        "queue_p95_s": max(r[f"{PREFIX}queue_s_p95"] for r in steps),
        "run_p50_s": run_p50,
        "run_p95_s": max(r[f"{PREFIX}run_s_p95"] for r in steps),
    }


def health_frame(results: Sequence[EvalResult], grpo_rows: Sequence[Mapping[str, float]] | None) -> pd.DataFrame:
    rows = [eval_health_row(r) for r in results]
    grpo = grpo_health_row(grpo_rows) if grpo_rows else None
    if grpo is not None:
        rows.insert(0, grpo)
    frame = pd.DataFrame.from_records(rows, columns=list(COLUMNS))
    for column in ("calls", "retried", "left_out", "problems_left_out"):
        frame[column] = frame[column].astype("Int64")  # counts, "-" where a row has none
    return frame


def health_markdown(frame: pd.DataFrame, plot: str | None) -> str:
    """health.md: the table, what its columns mean, and the plot's link."""
    header = ["stage", "benchmark", "calls", "calls / trajectory", *(f"{o} %" for o in OUTCOMES)]
    header += ["retried", "left out", "problems left out", "queue p95 s", "run p50 s", "run p95 s"]
    seconds = {"queue_p95_s", "run_p50_s", "run_p95_s"}
    rows = [
        [
            f"{row[c]:.3f}" if c in seconds and not pd.isna(row[c]) else (None if pd.isna(row[c]) else row[c])
            for c in COLUMNS
        ]
        for row in frame.to_dict("records")
    ]
    lost = frame["infra_failure_pct"].fillna(0.0)
    worst = float(lost.max()) if len(lost) else 0.0
    verdict = (
        "The sandbox lost no tool call."
        if worst == 0.0
        else f"The sandbox lost up to {worst:.1f} % of a stage's tool calls (infra_failure)."
    )
    parts = [
        "# Tool health",
        "",
        verdict,
        "",
        markdown_table(header, rows),
        "",
        "Outcome shares are of all calls of the stage: `ok`, and the model's failures `parse_failure` "
        "(malformed call), `program_error` (exception, non-zero exit), `program_timeout` (wall clock or "
        "CPU time), beside the sandbox's `infra_failure` (a lost execution, a dead worker, an "
        "unanswered or refused request, a queue wait over `sandbox.max_queue_wait_s`). A trajectory "
        "that met one is rolled out again (`retried`); one whose retry met one too is `left out` of "
        "advantages, pass rates and metrics (evaluation leaves out its problem whole). Latencies are "
        "GRPO's per-call queue wait and run time (evaluation and scoring log theirs).",
    ]
    if plot is not None:
        parts += ["", f"![GRPO tool health over the steps]({plot})"]
    return "\n".join(parts) + "\n"


def plot_grpo_health(rows: Sequence[Mapping[str, float]], out: Path) -> None:
    """GRPO's outcome shares (stacked) and latencies over the steps."""
    from agentrl.report.plots import _grid, _save, readable_y  # matplotlib only where a plot is drawn

    steps = [r for r in rows if f"{PREFIX}calls" in r]
    if not steps:
        raise ValueError("the RL training log has no tool_health/ keys (written before tool health was logged)")
    xs = [r["step"] for r in steps]
    fig, (shares, latency) = _grid(2, width=5.4)
    shares.stackplot(xs, *[[100.0 * r[f"{PREFIX}share/{o}"] for r in steps] for o in OUTCOMES], labels=OUTCOMES)
    shares.set_title("GRPO tool calls by outcome")
    shares.set_xlabel("training step")
    shares.set_ylabel("share of the step's calls (%)")
    shares.set_ylim(0, 100)
    shares.legend(fontsize=7, loc="lower left")
    seconds: list[float] = []
    for key, label in (("run_s_p50", "run p50"), ("run_s_p95", "run p95"), ("queue_s_p95", "queue wait p95")):
        seconds += [r[f"{PREFIX}{key}"] for r in steps]
        latency.plot(xs, seconds[-len(steps) :], marker="." if len(xs) < 50 else None, label=label)
    readable_y(latency, seconds)
    latency.set_title("GRPO tool-call latency")
    latency.set_xlabel("training step")
    latency.set_ylabel("seconds")
    latency.grid(alpha=0.3)
    latency.legend(fontsize=7)
    _save(fig, out)
