"""Tool health: what the tool calls of a set of trajectories came to, and the bound on lost executions.

Every tool call gets one outcome (:data:`agentrl.tools.sandbox.OUTCOMES`), classified where it
happens: ``parse_failure`` by the agent loop (a malformed call, never run), ``program_error``,
``program_timeout`` and ``ok`` from the program's exit, ``infra_failure`` by the sandbox (it lost
the execution, a worker died, the service did not answer or refused, the call waited past
``sandbox.max_queue_wait_s``). The first four are the model's doing and part of its reward; an
infrastructure failure is not: the agent loop retries such a trajectory once with the same
sample seeds, and one that meets a second is marked ``infra_failed`` and left out of advantages,
pass rates and metrics (as allenai/open-instruct drops rollouts lost to preemption from GRPO's
group statistics).

:func:`tool_health` summarizes trajectories in the same keys for every stage (GRPO's per-step
metrics, the scoring and evaluation summaries); :class:`InfraFailureBound` stops a stage whose
sandbox loses too many (``sandbox.max_infra_failure_share`` over ``sandbox.infra_failure_window``
trajectories) instead of letting it train on, or report, fake zeros.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from agentrl.config import SandboxConfig
from agentrl.tools.sandbox import OUTCOMES

log = logging.getLogger("agentrl.tools")

BOUND_KEY = "sandbox.max_infra_failure_share"


class InfraFailureShareExceeded(RuntimeError):
    """Too many trajectories lost a tool call to the sandbox: the stage stops before writing results."""


class InfraFailureBound:
    """Counts trajectories that met an infrastructure failure after their retry, over a window.

    ``observe`` judges once ``window`` trajectories have been seen, over the last ``window``;
    ``check`` (at the end of a rollout call) judges over what was seen when that is fewer. Either
    raises :class:`InfraFailureShareExceeded` naming the key when the share passes ``max_share``.
    """

    def __init__(self, max_share: float, window: int) -> None:
        assert 0.0 <= max_share <= 1.0, f"max_share must be in [0, 1], got {max_share}"
        assert window >= 1, f"window must be >= 1, got {window}"
        self.max_share = max_share
        self.window = window
        self.recent: deque[bool] = deque(maxlen=window)
        self.seen = 0
        self.failed = 0

    @classmethod
    def from_config(cls, cfg: SandboxConfig) -> InfraFailureBound:
        return cls(cfg.max_infra_failure_share, cfg.infra_failure_window)

    def observe(self, infra_failed: Iterable[bool]) -> None:
        for failed in infra_failed:
            self.recent.append(bool(failed))
            self.seen += 1
            self.failed += bool(failed)
        if len(self.recent) == self.window:
            self._judge()

    def check(self) -> None:
        if self.recent:
            self._judge()

    def _judge(self) -> None:
        share = sum(self.recent) / len(self.recent)
        if share > self.max_share:
            raise InfraFailureShareExceeded(
                f"{sum(self.recent)} of the last {len(self.recent)} trajectories lost a tool call to the sandbox "
                f"twice (infrastructure failures: a dead worker, an unanswered or refused request, a queue wait "
                f"over sandbox.max_queue_wait_s), a share of {share:.3f} over {BOUND_KEY}={self.max_share}; "
                "the stage stops rather than train on or report results the sandbox made up. Fix the sandbox "
                f"(its log says what failed), or raise {BOUND_KEY} to accept the loss"
            )


class ToolUse(NamedTuple):
    """The tool-health fields of one trajectory (cheap to gather across ranks)."""

    tool_outcomes: tuple[str, ...]
    tool_queue_s: tuple[float, ...]
    tool_run_s: tuple[float, ...]
    attempts: int
    infra_failed: bool

    @classmethod
    def of(cls, trajectory: Any) -> ToolUse:
        return cls(
            tuple(trajectory.tool_outcomes),
            tuple(trajectory.tool_queue_s),
            tuple(trajectory.tool_run_s),
            int(trajectory.attempts),
            bool(trajectory.infra_failed),
        )


def rows_tool_health(rows: Sequence[Mapping[str, Any]], prefix: str = "") -> dict[str, float]:
    """:func:`tool_health` of ``samples.jsonl`` rows (``tool_outcomes``, ``attempts``,
    ``infra_failed``; rows written before they existed count as calls of unknown outcome):
    without the latencies, which the rows leave out so that a samples file is the same for any
    shard count and machine (the stage logs them)."""
    uses = [
        ToolUse(
            tuple(row.get("tool_outcomes", ())),
            (),
            (),
            int(row.get("attempts", 1)),
            bool(row.get("infra_failed", False)),
        )
        for row in rows
    ]
    health = tool_health(uses)
    return {f"{prefix}{k}": v for k, v in health.items() if not k.startswith(("queue_s", "run_s"))}


def log_tool_health(rows: Sequence[Mapping[str, Any]], stage: str) -> dict[str, float]:
    """Log (and return) :func:`rows_tool_health` of a stage's rows in one line."""
    health = rows_tool_health(rows)
    shares = ", ".join(f"{o} {health[f'share/{o}']:.1%}" for o in OUTCOMES)
    log.info(
        "%s tool health: %d calls (%.2f per trajectory): %s; %d trajectories retried, %d left out",
        stage,
        health["calls"],
        health["calls_per_trajectory"],
        shares,
        health["retried"],
        health["infra_excluded"],
    )
    return health


def valid_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows not left out for an infrastructure failure (``infra_failed``)."""
    return [row for row in rows if not row.get("infra_failed", False)]


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def tool_health(trajectories: Sequence[Any], prefix: str = "") -> dict[str, float]:
    """The tool health of ``trajectories`` (records with ``tool_outcomes``, ``tool_queue_s``,
    ``tool_run_s``, ``attempts`` and ``infra_failed``; all of them, excluded ones included).

    Keys (``prefix`` before each): ``calls``; ``calls_per_trajectory``; ``share/<outcome>`` for
    every outcome (of all calls, summing to 1 when there are calls); ``queue_s_p50/p95`` and
    ``run_s_p50/p95`` over the calls that reached the sandbox; ``retried`` (trajectories rerun
    after an infrastructure failure) and ``infra_excluded`` (left out: their retry met one too).
    The retried first attempts are not in the call counts (their calls were thrown away).
    """
    outcomes = [o for t in trajectories for o in t.tool_outcomes]
    ran = [
        (queue, run)
        for t in trajectories
        for o, queue, run in zip(t.tool_outcomes, t.tool_queue_s, t.tool_run_s)
        if o != "parse_failure"
    ]
    calls = len(outcomes)
    out = {
        "calls": float(calls),
        "calls_per_trajectory": calls / len(trajectories) if trajectories else 0.0,
        **{f"share/{o}": (outcomes.count(o) / calls if calls else 0.0) for o in OUTCOMES},
        "queue_s_p50": _percentile([q for q, _ in ran], 50),
        "queue_s_p95": _percentile([q for q, _ in ran], 95),
        "run_s_p50": _percentile([r for _, r in ran], 50),
        "run_s_p95": _percentile([r for _, r in ran], 95),
        "retried": float(sum(t.attempts > 1 for t in trajectories)),
        "infra_excluded": float(sum(bool(t.infra_failed) for t in trajectories)),
    }
    return {f"{prefix}{key}": value for key, value in out.items()}
