"""Per-step metrics of GRPO: what the rollouts looked like, what the update did, where time went.

One JSON line per step in ``results/rl/metrics.jsonl`` (``step`` 0 holds the validation before
training; written by :class:`agentrl.training.metrics.MetricsWriter`), one short line on the
console (:func:`console_line`), and TensorBoard or W&B scalars when ``tracking`` is on. Keys are grouped by prefix: ``rollout/`` (rewards, lengths, tools), ``actor/`` (the
update), ``timing/`` (seconds), ``val/`` (validation, ``val/<set>/avg@<n>``).

Only rank 0 writes; the trainer gathers the other ranks' numbers first.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

log = logging.getLogger("agentrl.grpo")


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else 0.0


class TrajectorySummary(NamedTuple):
    """The numbers of one trained trajectory that the step metrics need (cheap to gather)."""

    response_length: int  # tokens, tool responses included
    generated_tokens: int  # loss-mask tokens
    num_turns: int
    tool_calls: int
    tool_errors: int
    finish_reason: str
    score: float
    acc: bool
    overlong_penalty: float
    advantage: float
    data_source: str


def rollout_metrics(summaries: Sequence[TrajectorySummary], *, max_response_tokens: int) -> dict[str, float]:
    """Means over the trajectories trained on this step (all ranks' trajectories, gathered)."""
    lengths = [s.response_length for s in summaries]
    scores = [s.score for s in summaries]
    calls = sum(s.tool_calls for s in summaries)
    errors = sum(s.tool_errors for s in summaries)
    advantage = np.asarray([s.advantage for s in summaries], dtype=float)
    return {
        "rollout/reward_mean": _mean(scores),
        "rollout/reward_std": float(np.std(scores)) if scores else 0.0,
        "rollout/acc_mean": _mean([float(s.acc) for s in summaries]),
        "rollout/overlong_penalty_mean": _mean([s.overlong_penalty for s in summaries]),
        "rollout/advantage_mean": float(advantage.mean()) if advantage.size else 0.0,
        "rollout/advantage_std": float(advantage.std()) if advantage.size else 0.0,
        "rollout/advantage_min": float(advantage.min()) if advantage.size else 0.0,
        "rollout/advantage_max": float(advantage.max()) if advantage.size else 0.0,
        "rollout/zero_advantage_share": float(np.mean(advantage == 0.0)) if advantage.size else 0.0,
        "rollout/response_length_mean": _mean(lengths),
        "rollout/response_length_max": float(max(lengths, default=0)),
        # Share that spent the whole budget (tool tokens included, as the overlong penalty counts).
        "rollout/response_clip_share": _mean([float(n >= max_response_tokens) for n in lengths]),
        "rollout/generated_tokens_mean": _mean([s.generated_tokens for s in summaries]),
        "rollout/turns_mean": _mean([s.num_turns for s in summaries]),
        "rollout/tool_calls_mean": _mean([s.tool_calls for s in summaries]),
        "rollout/tool_success_rate": (1.0 - errors / calls) if calls else 0.0,
        "rollout/finish_stop_share": _mean([float(s.finish_reason == "stop") for s in summaries]),
        "rollout/trajectories": float(len(summaries)),
        # Accuracy per data source (the embedded families, or upstream's math / code sources).
        **{
            f"rollout/acc/{source}": _mean([float(s.acc) for s in summaries if s.data_source == source])
            for source in sorted({s.data_source for s in summaries})
        },
    }


class TokenWeightedStats:
    """Accumulates per-micro-batch statistics weighted by their loss-token counts (per key, so
    statistics measured on different passes can share one accumulator)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.maxima: dict[str, float] = {}

    def add(self, stats: Mapping[str, float], tokens: float, maxima: Mapping[str, float] = ()) -> None:
        for key, value in stats.items():
            self.sums[key] = self.sums.get(key, 0.0) + float(value) * tokens
            self.weights[key] = self.weights.get(key, 0.0) + tokens
        for key, value in dict(maxima).items():
            self.maxima[key] = max(self.maxima.get(key, float("-inf")), float(value))

    def state(self) -> dict[str, Any]:
        return {"sums": self.sums, "weights": self.weights, "maxima": self.maxima}

    @staticmethod
    def merge(states: Iterable[Mapping[str, Any]]) -> dict[str, float]:
        """Token-weighted means (and maxima) over the states of several ranks."""
        states = list(states)
        out: dict[str, float] = {}
        for key in sorted({k for s in states for k in s["sums"]}):
            weight = sum(s["weights"].get(key, 0.0) for s in states)
            out[key] = sum(s["sums"].get(key, 0.0) for s in states) / weight if weight else 0.0
        for key in sorted({k for s in states for k in s["maxima"]}):
            out[key] = max(s["maxima"][key] for s in states if key in s["maxima"])
        return out


CONSOLE_KEYS = (
    ("rollout/reward_mean", "reward"),
    ("rollout/acc_mean", "acc"),
    ("rollout/response_length_mean", "len"),
    ("rollout/tool_calls_mean", "calls"),
    ("actor/entropy", "ent"),
    ("actor/approx_kl_k3", "kl"),
    ("actor/clip_frac_high", "clip+"),
    ("actor/grad_norm", "gnorm"),
    ("timing/step_s", "s"),
)


def console_line(record: Mapping[str, Any], total_steps: int) -> str:
    parts = [f"step {record['step']}/{total_steps}"]
    parts += [f"{label} {record[key]:.4g}" for key, label in CONSOLE_KEYS if key in record]
    val = {k: v for k, v in record.items() if k.startswith("val/mean/")}
    parts += [f"{k} {v:.4g}" for k, v in val.items()]
    return " | ".join(parts)
