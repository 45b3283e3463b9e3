"""The ablation figures (``<question>.png``): curves over GRPO steps per arm and the final evaluation.

One figure per question of ``ablations.questions``, one color per arm across all of them:

- data, algorithm: training accuracy and policy entropy over steps, then the final avg@n per benchmark;
- reasoning: tool calls, tool success, training accuracy and policy entropy over steps, then the
  reasoning modes at evaluation.

A curve is the mean over seeds of a trailing mean over ``ablations.smoothing_window`` steps, its band
the seeds' min-max (:func:`agentrl.report.ablations.seed_band` computes them from the GRPO logs). An arm
whose logs lack a key (older logs without ``actor/entropy``) has no curve in that panel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")  # files only; a cluster node has no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from agentrl.config import AblationsConfig  # noqa: E402
from agentrl.report.plots import readable_y  # noqa: E402

# the GRPO log keys drawn over steps
ACC_KEY = "rollout/acc_mean"
CALLS_KEY = "rollout/tool_calls_mean"
SUCCESS_KEY = "rollout/tool_success_rate"
ENTROPY_KEY = "actor/entropy"
CURVE_KEYS = (ACC_KEY, CALLS_KEY, SUCCESS_KEY, ENTROPY_KEY)


class Band(NamedTuple):
    """One arm's curve of one key: at each step, the mean, min and max over the ``seeds`` that logged it."""

    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    seeds: int


def _curves(
    ax,
    key: str,
    ylabel: str,
    title: str,
    scale: float = 1.0,
    *,
    bands: Mapping[str, Mapping[str, Band | None]],
    arms: Sequence[str],
    colors: Mapping[str, str],
) -> None:
    """Per arm, the mean over seeds of ``key`` (``bands``: arm -> key -> :class:`Band`) and its seed min-max band."""
    values: list[float] = []
    for arm in arms:
        band = bands[arm].get(key)
        if band is None:
            continue
        values += [*(scale * band.low), *(scale * band.high)]
        ax.plot(
            band.steps, scale * band.mean, color=colors[arm], linewidth=1.6, label=f"{arm} (mean of {band.seeds} seeds)"
        )
        ax.fill_between(band.steps, scale * band.low, scale * band.high, color=colors[arm], alpha=0.2, linewidth=0)
    if values:
        readable_y(ax, values)
    else:
        ax.text(0.5, 0.5, f"no run logs {key}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("GRPO step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)


def _avg_bars(
    ax,
    arms: Sequence[str],
    table: Mapping[str, Mapping[str, Any]],
    names: Sequence[str],
    colors: Mapping[str, str],
    n: int,
) -> None:
    """Final avg@n per benchmark and their mean: bars the mean over seeds, whiskers the seed min-max."""
    x, width = np.arange(len(names)), 0.8 / len(arms)
    for i, arm in enumerate(arms):
        spreads = [table[arm][f"avg@n/{b}"] for b in names]
        mean = np.array([100 * s.mean for s in spreads])
        err = [mean - [100 * s.min for s in spreads], [100 * s.max for s in spreads] - mean]
        ax.bar(x + (i - (len(arms) - 1) / 2) * width, mean, width, yerr=err, capsize=3, color=colors[arm], label=arm)
    ax.set_xticks(x, names)
    ax.set_ylabel(f"avg@{n} (%)")
    ax.set_title(f"final evaluation: avg@{n} (bars: mean; whiskers: seed min-max)", fontsize=10)
    ax.grid(alpha=0.3, axis="y")


def _mode_bars(ax, arms: Sequence[str], table: Mapping[str, Mapping[str, Any]]) -> None:
    """The shares of deliberative, reactive and tool-free responses at evaluation, stacked per arm."""
    bottom = np.zeros(len(arms))
    for mode, color in (("deliberative", "#238b45"), ("reactive", "#fd8d3c"), ("no_tool", "#bdbdbd")):
        share = np.array([100 * (table[a][f"eval/{mode}_share"].mean or 0.0) for a in arms])
        ax.bar(np.arange(len(arms)), share, 0.6, bottom=bottom, color=color, label=mode.replace("_", " "))
        bottom += share
    ax.set_xticks(np.arange(len(arms)), arms, rotation=20)
    ax.set_ylabel("responses (%)")
    ax.set_title("reasoning modes at evaluation (mean over seeds)", fontsize=10)


def plot_question(
    question: str,
    arms: Sequence[str],
    bands: Mapping[str, Mapping[str, Band | None]],
    table: Mapping[str, Mapping[str, Any]],
    benchmarks: Sequence[str],
    n: int,
    cfg: AblationsConfig,
    out: Path,
) -> list[str]:
    """The figure of one question (see the module docstring); ``bands``: arm -> key -> :class:`Band`,
    ``table``: arm -> metric -> spread over seeds. Returns the panels' titles, left to right."""
    w = cfg.smoothing_window
    colors = {arm: f"C{i}" for i, arm in enumerate(cfg.arms)}  # one color per arm in every figure
    panels = 3 if question != "reasoning" else 5
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2), dpi=110, squeeze=False)
    axes = list(axes.flat)
    curves = partial(_curves, bands=bands, arms=arms, colors=colors)
    acc = (ACC_KEY, "rollout/acc_mean (%)", f"training accuracy (mean of {w} steps; band: seed min-max)", 100.0)
    entropy = (ENTROPY_KEY, "actor/entropy (nats / token)", f"policy entropy (mean of {w} steps; band: seed min-max)")
    if question != "reasoning":
        curves(axes[0], *acc)
        threshold = 100 * cfg.accuracy_threshold
        axes[0].axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold:g} %")
        curves(axes[1], *entropy)
        _avg_bars(axes[2], arms, table, [*benchmarks, "mean"], colors, n)
    else:
        curves(axes[0], CALLS_KEY, "tool calls per response", "tool calls over training")
        curves(axes[1], SUCCESS_KEY, "successful calls (%)", "tool success over training", 100.0)
        curves(axes[2], *acc)
        curves(axes[3], *entropy)
        _mode_bars(axes[4], arms, table)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"Ablation: {question}", fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return [ax.get_title() for ax in axes]
