"""The report's plots: accuracy by model stage, reasoning modes, training curves.

Each plot is a PNG a person can read at a glance: a title saying what it shows, labelled axes
with units, values written on the bars. Training logs (``results/sft/metrics.jsonl``,
``results/rl/metrics.jsonl``) are read by key name rather than a fixed schema: every numeric
key (nested dicts flattened with ``/``) that matches a panel's pattern is drawn in that panel
against ``step``, so a trainer that logs one more clip fraction gets it plotted without a
change here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; a cluster node has no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from agentrl.errors import DataFormatError  # noqa: E402
from agentrl.report.tables import EvalResult, PublishedModel  # noqa: E402
from agentrl.sampling.samples import read_jsonl  # noqa: E402

STEP_KEYS = ("step", "global_step", "train/step", "training/global_step")
# (panel title, y label, key pattern); a key goes to the first panel whose pattern it matches.
TRAINING_PANELS: tuple[tuple[str, str, str], ...] = (
    ("Reward", "mean reward", r"reward|score"),
    ("Accuracy", "accuracy (fraction)", r"acc"),
    ("Loss", "loss", r"loss"),
    ("Entropy", "entropy (nats / token)", r"entropy"),
    ("Response length", "tokens", r"response_len|resp_len|response_length|length"),
    ("Tool calls", "tool calls per response", r"tool_call|num_tool|tool_calls"),
    ("Clip fractions", "fraction of tokens", r"clip"),
    ("Learning rate", "learning rate", r"(^|[/_])lr($|[/_])|learning_rate"),
    ("Gradient norm", "gradient norm", r"grad_norm"),
)
MODEL_COLORS = {"base": "#9ecae1", "sft": "#4292c6", "rl": "#08306b"}


def _save(fig, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


# A series whose spread is below this share of its size is drawn as flat: matplotlib would
# stretch float noise (or nothing: a constant learning rate) over the whole axis.
FLAT_SPREAD = 1e-6


def readable_y(ax, values: Sequence[float]) -> None:
    """Tick labels as the values are, and a flat series in a range that shows it flat.

    matplotlib labels values that differ only in late digits by an offset (ticks ``0.0002`` under
    ``+6.459``: the reader has to add them up), and autoscales a constant to +-5 % of itself,
    which reads as movement; a flat series is drawn at mid-height of [0, 2 x value] instead.
    """
    ax.ticklabel_format(axis="y", useOffset=False)
    finite = [float(v) for v in values if math.isfinite(v)]
    if not finite:
        return
    low, high = min(finite), max(finite)
    size = max(abs(low), abs(high))
    if high - low > FLAT_SPREAD * size:
        return
    if size == 0:
        ax.set_ylim(-1.0, 1.0)
    elif low > 0:
        ax.set_ylim(0.0, 2.0 * high)
    else:
        ax.set_ylim(2.0 * low, 0.0)


def _grid(count: int, width: float = 4.6, height: float = 4.0, columns: int = 3):
    columns = min(columns, count)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), dpi=110, squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:count])


# --------------------------------------------------------------------------- evaluation
def plot_accuracy_by_stage(
    results: Sequence[EvalResult], out: Path, published: Mapping[str, PublishedModel] | None = None
) -> None:
    """Per benchmark: avg@n of each model with its 95 % interval, pass@n as a marker, and the
    published figure of a model that ``published`` maps to a released one as another marker."""
    published = published or {}
    benchmarks = list(dict.fromkeys(r.benchmark for r in results))
    fig, axes = _grid(len(benchmarks))
    for ax, benchmark in zip(axes, benchmarks):
        rows = [r for r in results if r.benchmark == benchmark]
        models = [r.label for r in rows]
        x = np.arange(len(rows))
        n = [int(r.metrics["samples_per_problem"]) for r in rows]
        avg = np.array([100 * r.metrics[f"avg@{k}"] for r, k in zip(rows, n)])
        ci = np.array([[100 * v for v in r.metrics["ci"][f"avg@{k}"]] for r, k in zip(rows, n)])
        passes = [100 * r.metrics["pass@k"][str(k)] for r, k in zip(rows, n)]
        below, above = (avg - ci[:, 0]).clip(min=0), (ci[:, 1] - avg).clip(min=0)  # (M,) each
        ax.bar(
            x,
            avg,
            0.6,
            color=[MODEL_COLORS.get(r.model, "#807dba") for r in rows],
            yerr=[below.tolist(), above.tolist()],
            capsize=4,
            label="avg@n (95 % CI)",
        )
        ax.scatter(x, passes, marker="^", color="#d94801", zorder=3, label="pass@n (unbiased)")
        marks = [
            (xi, published[r.model].figure(r.reasoning, benchmark)) for xi, r in zip(x, rows) if r.model in published
        ]
        marks = [(xi, v) for xi, v in marks if v is not None]
        if marks:
            ax.scatter(*zip(*marks), marker="D", color="black", zorder=4, label="published avg@32")
        # The avg@n value goes under the model's name: above the bar it would collide with the CI.
        ax.set_xticks(x, [f"{m} (n={k})\navg {v:.1f}%" for m, k, v in zip(models, n, avg)])
        ax.set_ylim(0, 105)
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{benchmark}: accuracy by model stage")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    _save(fig, out)


def plot_reasoning_modes(results: Sequence[EvalResult], out: Path) -> None:
    """Per benchmark: share of deliberative / reactive / tool-free responses per model, tool success on top."""
    benchmarks = list(dict.fromkeys(r.benchmark for r in results))
    fig, axes = _grid(len(benchmarks))
    colors = {"deliberative": "#238b45", "reactive": "#fd8d3c", "no_tool": "#bdbdbd"}
    for ax, benchmark in zip(axes, benchmarks):
        rows = [r for r in results if r.benchmark == benchmark]
        x = np.arange(len(rows))
        bottom = np.zeros(len(rows))
        for mode, color in colors.items():
            share = np.array([100 * r.metrics["tool_use"]["modes"][mode]["share"] for r in rows])
            ax.bar(x, share, 0.6, bottom=bottom, color=color, label=mode.replace("_", " "))
            bottom += share
        for xi, r in zip(x, rows):
            tool = r.metrics["tool_use"]
            success = tool["tool_success_rate"]
            calls = f"{tool['tool_calls_per_response']:.1f} calls/response"
            text = calls + ("\nno calls" if success is None else f"\n{100 * success:.0f}% calls ok")
            ax.text(xi, 101, text, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [r.label for r in rows])
        ax.set_ylim(0, 125)
        ax.set_ylabel("responses (%)")
        ax.set_title(f"{benchmark}: reasoning modes")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
    _save(fig, out)


# --------------------------------------------------------------------------- training curves
def _flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    flat: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            flat[name] = float(value)
    return flat


def read_training_log(path: str | Path) -> tuple[str, list[dict[str, float]]]:
    """Numeric rows of a metrics.jsonl and the name of its step key (``row`` when it has none)."""
    rows = [_flatten(row) for row in read_jsonl(path)]
    if not rows:
        raise DataFormatError(
            f"{path}: no rows; the training stage logged no step (did it stop before its first step?); "
            "run the stage again (snakemake --forcerun sft or grpo)"
        )
    step_key = next((k for k in STEP_KEYS if all(k in r for r in rows)), None)
    if step_key is None:
        for index, row in enumerate(rows, 1):
            row["row"] = float(index)
        step_key = "row"
    return step_key, rows


# Durations, token counts and spreads share words with the panels ("timing/reward_s",
# "actor/loss_tokens", "rollout/reward_std") but not their units: drawn beside the values they
# would flatten them.
NOT_PLOTTED = re.compile(r"^timing/|_s$|_tokens$|tokens_per_s|_std$")


def training_panels(keys: Sequence[str], step_key: str) -> dict[str, list[str]]:
    """Panel title -> metric keys drawn in it (keys matching no panel are not drawn)."""
    panels: dict[str, list[str]] = {}
    for key in keys:
        if key == step_key or key in STEP_KEYS or key in ("epoch", "time", "timestamp") or NOT_PLOTTED.search(key):
            continue
        for title, _, pattern in TRAINING_PANELS:
            if re.search(pattern, key.lower()):
                panels.setdefault(title, []).append(key)
                break
    return panels


def plot_training_curves(path: str | Path, out: Path, stage: str) -> list[str]:
    """One panel per metric group of a training log; returns the keys drawn."""
    fig, drawn = training_figure(path, stage)
    _save(fig, out)
    return drawn


def training_figure(path: str | Path, stage: str):
    """The figure of :func:`plot_training_curves` and the keys drawn in it."""
    step_key, rows = read_training_log(path)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    panels = training_panels(keys, step_key)
    if not panels:
        raise DataFormatError(
            f"{path}: none of the keys {keys} is a known training metric "
            f"(patterns: {[p for _, _, p in TRAINING_PANELS]})"
        )
    fig, axes = _grid(len(panels))
    labels = {title: ylabel for title, ylabel, _ in TRAINING_PANELS}
    for ax, (title, members) in zip(axes, panels.items()):
        drawn_values: list[float] = []
        for key in members:
            points = [(row[step_key], row[key]) for row in rows if key in row]
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="." if len(points) < 50 else None, linewidth=1.2, label=key)
            drawn_values += ys
        readable_y(ax, drawn_values)
        ax.set_title(f"{stage}: {title.lower()}")
        ax.set_xlabel("training step" if step_key != "row" else "logged row")  # GRPO: a rollout batch, not one update
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(labels[title])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{stage} training curves ({Path(path).name})", fontsize=11)
    return fig, [k for members in panels.values() for k in members]
