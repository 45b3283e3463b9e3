"""The ablation tables and plots: the paper's three questions (data, algorithm, reasoning mode).

``python -m agentrl report ablations`` reads what ``snakemake ablations`` (rules/ablations.smk)
wrote, laid out as

- ``.../<arm>/seed<k>/rl/metrics.jsonl``: the GRPO log of one arm and seed;
- ``.../<arm>/seed<k>/eval/<benchmark>/{metrics.json,samples.jsonl}``: its final model's evaluation,

and writes, for each question of ``ablations.questions``, ``<question>.md`` (tables), ``<question>.csv``
(long format: one row per arm and metric, with the per-seed values) and ``<question>.png``.

Per run (one arm, one seed; :func:`run_metrics`):

- ``avg@n/<benchmark>`` and ``pass@n/<benchmark>`` (the unbiased estimator) of the final model,
  and their means over benchmarks (``.../mean``);
- ``steps_to_reach``: the first step s whose smoothed training accuracy
  ``a_s = mean(acc_{max(1, s - w + 1)} .. acc_s)`` (``rollout/acc_mean``, a trailing window of
  ``w = ablations.smoothing_window`` steps) is at least ``ablations.accuracy_threshold``; None
  (shown "not reached") when no step is; ``final_train_acc`` = ``a`` at the last step. The
  training accuracy is measured on each arm's own RL prompts, so arms trained on different sets
  (filtered vs the pool) start from different levels; the final evaluation uses the same sets;
- tool use at evaluation, pooled over the benchmarks' samples: tool calls per response, tool
  success rate (successful calls / calls), and the share of deliberative, reactive and tool-free
  responses (:func:`agentrl.sampling.metrics.reasoning_mode`, with the thresholds
  ``ablations.deliberative_max_calls`` / ``deliberative_min_tokens_per_call``);
- tool use over training: smoothed ``rollout/tool_calls_mean`` and ``rollout/tool_success_rate``
  at the first and the last step.

Per arm (:func:`aggregate`): mean, sample standard deviation (ddof = 1; none for a single
seed), min and max over seeds; ``steps_to_reach`` over the seeds that reached the threshold, with
how many did. Rates are shown in percent.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; a cluster node has no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from agentrl.config import AblationsConfig, ConfigError  # noqa: E402
from agentrl.errors import read_json_file  # noqa: E402
from agentrl.report.plots import readable_y  # noqa: E402
from agentrl.sampling.metrics import SampleRecord, tool_use_stats  # noqa: E402
from agentrl.sampling.samples import read_jsonl  # noqa: E402
from agentrl.training.metrics import read_metrics  # noqa: E402

log = logging.getLogger("agentrl.report.ablations")

ACC_KEY = "rollout/acc_mean"
CALLS_KEY = "rollout/tool_calls_mean"
SUCCESS_KEY = "rollout/tool_success_rate"
QUESTIONS = ("data", "algorithm", "reasoning")
_RUN_DIR = re.compile(r"^seed(\d+)$")


# --------------------------------------------------------------------------- config and layout
def check_ablations(cfg: AblationsConfig) -> None:
    """Every arm a question names must be defined under ablations.arms."""
    for question in QUESTIONS:
        unknown = [arm for arm in getattr(cfg.questions, question) if arm not in cfg.arms]
        if unknown:
            raise ConfigError(
                f"ablations.questions.{question} names undefined arm(s) {unknown}; "
                f"defined under ablations.arms: {sorted(cfg.arms)}"
            )


def locate(path: str | Path, kind: str) -> tuple[str, int, str | None]:
    """``(arm, seed, benchmark)`` of a file in the ablations layout (benchmark None for the GRPO log).

    ``kind`` is ``training`` (``<arm>/seed<k>/rl/metrics.jsonl``) or ``eval``
    (``<arm>/seed<k>/eval/<benchmark>/<file>``).
    """
    parts = Path(path).parts
    if kind == "training":
        ok = len(parts) >= 4 and parts[-2:] == ("rl", "metrics.jsonl") and _RUN_DIR.match(parts[-3])
        if ok:
            return parts[-4], int(_RUN_DIR.match(parts[-3]).group(1)), None
        raise ValueError(f"{path}: expected a GRPO log at <arm>/seed<k>/rl/metrics.jsonl")
    ok = len(parts) >= 5 and parts[-3] == "eval" and _RUN_DIR.match(parts[-4])
    if ok:
        return parts[-5], int(_RUN_DIR.match(parts[-4]).group(1)), parts[-2]
    raise ValueError(f"{path}: expected an evaluation file at <arm>/seed<k>/eval/<benchmark>/{Path(path).name}")


# --------------------------------------------------------------------------- one run
def smooth(values: Sequence[float], window: int) -> np.ndarray:
    """Trailing moving average: ``out[i] = mean(values[max(0, i - window + 1) .. i])``."""
    assert window >= 1, f"smoothing window must be >= 1, got {window}"
    x = np.asarray(values, dtype=float)
    sums = np.cumsum(np.concatenate([[0.0], x]))  # sums[i] = x[0] + ... + x[i-1]
    ends = np.arange(1, x.size + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def steps_to_reach(steps: Sequence[int], values: Sequence[float], threshold: float, window: int) -> int | None:
    """The first step whose smoothed value is >= threshold (None when none is)."""
    if len(steps) == 0:
        return None
    hits = np.nonzero(smooth(values, window) >= threshold)[0]
    return int(steps[hits[0]]) if hits.size else None


def training_curve(records: Sequence[Mapping[str, Any]], key: str, source: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``key`` over the training steps (validation-only records skipped)."""
    rows = sorted((int(r["step"]), float(r[key])) for r in records if key in r and "step" in r)
    if not rows:
        raise ValueError(f"{source}: no step logs {key!r}; is it a GRPO metrics.jsonl?")
    steps = [s for s, _ in rows]
    if len(set(steps)) != len(steps):
        raise ValueError(f"{source}: step(s) logged twice: {sorted({s for s in steps if steps.count(s) > 1})}")
    return steps, [v for _, v in rows]


@dataclass(frozen=True)
class Run:
    """What one arm and seed produced: its GRPO log and, per benchmark, its eval metrics and samples."""

    arm: str
    seed: int
    training: list[dict[str, Any]]
    training_source: str
    evals: dict[str, dict[str, Any]]  # benchmark -> metrics.json
    samples: dict[str, list[SampleRecord]]  # benchmark -> samples.jsonl rows


def run_metrics(run: Run, cfg: AblationsConfig) -> dict[str, float | None]:
    """The scalar metrics of one run (see the module docstring); rates are fractions."""
    out: dict[str, float | None] = {}
    avg, passed = [], []
    for benchmark, metrics in run.evals.items():
        n = int(metrics["samples_per_problem"])
        out[f"avg@n/{benchmark}"] = avg_n = float(metrics[f"avg@{n}"])
        out[f"pass@n/{benchmark}"] = pass_n = float(metrics["pass@k"][str(n)])
        avg.append(avg_n)
        passed.append(pass_n)
    out["avg@n/mean"] = float(np.mean(avg))
    out["pass@n/mean"] = float(np.mean(passed))

    window = cfg.smoothing_window
    steps, acc = training_curve(run.training, ACC_KEY, run.training_source)
    reached = steps_to_reach(steps, acc, cfg.accuracy_threshold, window)
    out["steps_to_reach"] = None if reached is None else float(reached)
    out["final_train_acc"] = float(smooth(acc, window)[-1])
    for key, name in ((CALLS_KEY, "tool_calls"), (SUCCESS_KEY, "tool_success")):
        _, values = training_curve(run.training, key, run.training_source)
        smoothed = smooth(values, window)
        out[f"train/{name}_first"], out[f"train/{name}_last"] = float(smoothed[0]), float(smoothed[-1])

    records = [r for benchmark in run.evals for r in run.samples[benchmark]]
    tool = tool_use_stats(
        records, max_calls=cfg.deliberative_max_calls, min_tokens_per_call=cfg.deliberative_min_tokens_per_call
    )
    out["eval/tool_calls_per_response"] = tool["tool_calls_per_response"]
    out["eval/tool_success_rate"] = tool["tool_success_rate"]
    for mode in ("deliberative", "reactive", "no_tool"):
        out[f"eval/{mode}_share"] = tool["modes"][mode]["share"]
    return out


# --------------------------------------------------------------------------- over seeds
@dataclass(frozen=True)
class Spread:
    """Mean, sample std (None for one value), min and max of the values that exist; ``count`` of them."""

    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    count: int
    seeds: int


def spread(values: Sequence[float | None]) -> Spread:
    present = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if present.size == 0:
        return Spread(None, None, None, None, 0, len(values))
    std = float(present.std(ddof=1)) if present.size > 1 else None
    return Spread(
        float(present.mean()), std, float(present.min()), float(present.max()), int(present.size), len(values)
    )


def aggregate(per_seed: Mapping[str, Sequence[Mapping[str, float | None]]]) -> dict[str, dict[str, Spread]]:
    """arm -> metric -> :class:`Spread` over the arm's seeds."""
    out: dict[str, dict[str, Spread]] = {}
    for arm, runs in per_seed.items():
        keys = list(dict.fromkeys(k for r in runs for k in r))
        out[arm] = {key: spread([r.get(key) for r in runs]) for key in keys}
    return out


# --------------------------------------------------------------------------- tables
def _is_rate(metric: str) -> bool:
    return not (
        metric == "steps_to_reach" or metric.startswith("train/tool_calls") or metric.startswith("eval/tool_calls")
    )


def format_spread(s: Spread, percent: bool, digits: int | None = None, range_digits: int | None = None) -> str:
    """``mean ± std [min-max]`` (percent for rates: 1 decimal, else 2); ``-`` when no seed has a value."""
    if s.mean is None:
        return "-"
    scale = 100.0 if percent else 1.0
    digits = digits if digits is not None else (1 if percent else 2)
    range_digits = digits if range_digits is None else range_digits
    std = "" if s.std is None else f" ± {scale * s.std:.{digits}f}"
    return f"{scale * s.mean:.{digits}f}{std} [{scale * s.min:.{range_digits}f}-{scale * s.max:.{range_digits}f}]"


def _steps_cell(s: Spread) -> str:
    if s.count == 0:
        return f"not reached (0/{s.seeds})"
    return f"{format_spread(s, percent=False, digits=1, range_digits=0)} ({s.count}/{s.seeds} reached)"


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _arm_label(arm: str, cfg: AblationsConfig) -> str:
    a = cfg.arms[arm]
    return f"{arm} ({a.sft_data} SFT, {'filtered' if a.rl_data == 'filtered' else 'unfiltered pool'}, {a.variant})"


def question_markdown(
    question: str,
    arms: Sequence[str],
    table: Mapping[str, Mapping[str, Spread]],
    benchmarks: Sequence[str],
    n: int,
    cfg: AblationsConfig,
) -> str:
    """The markdown of one question: the final evaluation and training tables (data, algorithm), or tool use (reasoning)."""
    seeds = ", ".join(map(str, cfg.seeds))
    parts = [
        f"# Ablation: {question}",
        f"Mean ± sample std [min-max] over seeds {seeds}; rates in %. The first row is the reference arm.",
    ]
    if question in ("data", "algorithm"):
        parts += _final_evaluation_section(arms, table, benchmarks, n, cfg)
        parts += _training_section(arms, table, cfg)
    else:
        parts += _reasoning_section(arms, table, n, cfg)
    return "\n\n".join(parts) + "\n"


def _cell(table: Mapping[str, Mapping[str, Spread]], arm: str, metric: str) -> str:
    return format_spread(table[arm][metric], _is_rate(metric))


def _final_evaluation_section(
    arms: Sequence[str],
    table: Mapping[str, Mapping[str, Spread]],
    benchmarks: Sequence[str],
    n: int,
    cfg: AblationsConfig,
) -> list[str]:
    """avg@n and pass@n of each arm's final model, per benchmark and their mean."""
    header = [
        "arm",
        *(f"avg@{n} {b}" for b in benchmarks),
        f"avg@{n} mean",
        *(f"pass@{n} {b}" for b in benchmarks),
        f"pass@{n} mean",
    ]
    rows = [
        [
            _arm_label(a, cfg),
            *(_cell(table, a, f"avg@n/{b}") for b in [*benchmarks, "mean"]),
            *(_cell(table, a, f"pass@n/{b}") for b in [*benchmarks, "mean"]),
        ]
        for a in arms
    ]
    return ["## Final evaluation", _markdown(header, rows)]


def _training_section(
    arms: Sequence[str], table: Mapping[str, Mapping[str, Spread]], cfg: AblationsConfig
) -> list[str]:
    """How fast each arm's training accuracy reached the threshold, where it ended, and its tool use at evaluation."""
    threshold = f"{100 * cfg.accuracy_threshold:g} %"
    header = [
        "arm",
        f"steps to training accuracy >= {threshold}",
        "final training accuracy",
        "tool calls / response (eval)",
        "tool success (eval)",
    ]
    rows = [
        [
            _arm_label(a, cfg),
            _steps_cell(table[a]["steps_to_reach"]),
            _cell(table, a, "final_train_acc"),
            _cell(table, a, "eval/tool_calls_per_response"),
            _cell(table, a, "eval/tool_success_rate"),
        ]
        for a in arms
    ]
    return [
        "## Training",
        _markdown(header, rows),
        f"Training accuracy: rollout/acc_mean on the arm's own RL prompts, trailing mean over "
        f"{cfg.smoothing_window} steps.",
    ]


def _reasoning_section(
    arms: Sequence[str], table: Mapping[str, Mapping[str, Spread]], n: int, cfg: AblationsConfig
) -> list[str]:
    """Tool use and reasoning modes at evaluation, and tool use at the first and last training step."""
    header = [
        "arm",
        "tool calls / response",
        "tool success",
        "deliberative",
        "reactive",
        "no tool",
        f"avg@{n} mean",
        "train: tool calls first -> last",
        "train: tool success first -> last",
    ]
    cell = lambda arm, metric: _cell(table, arm, metric)  # noqa: E731
    rows = [
        [
            _arm_label(a, cfg),
            cell(a, "eval/tool_calls_per_response"),
            cell(a, "eval/tool_success_rate"),
            cell(a, "eval/deliberative_share"),
            cell(a, "eval/reactive_share"),
            cell(a, "eval/no_tool_share"),
            cell(a, "avg@n/mean"),
            f"{cell(a, 'train/tool_calls_first')} -> {cell(a, 'train/tool_calls_last')}",
            f"{cell(a, 'train/tool_success_first')} -> {cell(a, 'train/tool_success_last')}",
        ]
        for a in arms
    ]
    return [
        "## Reasoning modes at evaluation and over training",
        _markdown(header, rows),
        f"Deliberative: at most {cfg.deliberative_max_calls} calls and at least "
        f"{cfg.deliberative_min_tokens_per_call} model tokens before each call on average; reactive: "
        f"every other response with calls (agentrl.sampling.metrics.reasoning_mode). Tool calls, "
        f"success and modes are pooled over the benchmarks' samples; training values are smoothed over "
        f"{cfg.smoothing_window} steps (the GRPO log counts a step without any call as 0 % success).",
    ]


def question_frame(
    question: str,
    arms: Sequence[str],
    table: Mapping[str, Mapping[str, Spread]],
    per_seed: Mapping[str, Sequence[Mapping[str, float | None]]],
    cfg: AblationsConfig,
) -> pd.DataFrame:
    """Long format: one row per (arm, metric) with the spread and the per-seed values (fractions, not %)."""
    rows = []
    for arm in arms:
        a = cfg.arms[arm]
        for metric, s in table[arm].items():
            rows.append(
                {
                    "question": question,
                    "arm": arm,
                    "sft_data": a.sft_data,
                    "rl_data": a.rl_data,
                    "variant": a.variant,
                    "metric": metric,
                    "mean": s.mean,
                    "std": s.std,
                    "min": s.min,
                    "max": s.max,
                    "seeds_with_value": s.count,
                    "seeds": s.seeds,
                    "values": json.dumps([r.get(metric) for r in per_seed[arm]]),
                }
            )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- plots
def seed_band(runs: Sequence[Run], key: str, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(steps, mean, min, max)`` over seeds of the smoothed ``key``, at every step some seed logged."""
    curves = []
    for run in runs:
        steps, values = training_curve(run.training, key, run.training_source)
        curves.append(dict(zip(steps, smooth(values, window))))
    steps = np.array(sorted({s for c in curves for s in c}))
    at = [[c[s] for c in curves if s in c] for s in steps]
    return steps, np.array([np.mean(v) for v in at]), np.array([min(v) for v in at]), np.array([max(v) for v in at])


def _curves(
    ax,
    runs_by_arm: Mapping[str, Sequence[Run]],
    arms: Sequence[str],
    colors: Mapping[str, str],
    key: str,
    window: int,
    ylabel: str,
    title: str,
    scale: float = 1.0,
) -> None:
    bands: list[float] = []
    for arm in arms:
        steps, mean, low, high = seed_band(runs_by_arm[arm], key, window)
        bands += [*(scale * low), *(scale * high)]
        ax.plot(
            steps,
            scale * mean,
            color=colors[arm],
            linewidth=1.6,
            label=f"{arm} (mean of {len(runs_by_arm[arm])} seeds)",
        )
        ax.fill_between(steps, scale * low, scale * high, color=colors[arm], alpha=0.2, linewidth=0)
    readable_y(ax, bands)
    ax.set_xlabel("GRPO step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)


def plot_question(
    question: str,
    arms: Sequence[str],
    runs_by_arm: Mapping[str, Sequence[Run]],
    table: Mapping[str, Mapping[str, Spread]],
    benchmarks: Sequence[str],
    n: int,
    cfg: AblationsConfig,
    out: Path,
) -> None:
    """data / algorithm: training accuracy with seed bands and final avg@n per benchmark;
    reasoning: tool calls, tool success and accuracy over training, and the reasoning modes at evaluation."""
    w = cfg.smoothing_window
    colors = {arm: f"C{i}" for i, arm in enumerate(cfg.arms)}  # one color per arm in every figure
    panels = 2 if question != "reasoning" else 4
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2), dpi=110, squeeze=False)
    axes = list(axes.flat)
    acc_title = f"training accuracy (mean of {w} steps; band: seed min-max)"
    if question != "reasoning":
        _curves(axes[0], runs_by_arm, arms, colors, ACC_KEY, w, "rollout/acc_mean (%)", acc_title, 100.0)
        axes[0].axhline(
            100 * cfg.accuracy_threshold,
            color="grey",
            linestyle="--",
            linewidth=1,
            label=f"threshold {100 * cfg.accuracy_threshold:g} %",
        )
        ax, names = axes[1], [*benchmarks, "mean"]
        x, width = np.arange(len(names)), 0.8 / len(arms)
        for i, arm in enumerate(arms):
            spreads = [table[arm][f"avg@n/{b}"] for b in names]
            mean = np.array([100 * s.mean for s in spreads])
            err = [mean - [100 * s.min for s in spreads], [100 * s.max for s in spreads] - mean]
            ax.bar(
                x + (i - (len(arms) - 1) / 2) * width, mean, width, yerr=err, capsize=3, color=colors[arm], label=arm
            )
        ax.set_xticks(x, names)
        ax.set_ylabel(f"avg@{n} (%)")
        ax.set_title(f"final evaluation: avg@{n} (bars: mean; whiskers: seed min-max)", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    else:
        _curves(axes[0], runs_by_arm, arms, colors, CALLS_KEY, w, "tool calls per response", "tool calls over training")
        _curves(
            axes[1],
            runs_by_arm,
            arms,
            colors,
            SUCCESS_KEY,
            w,
            "successful calls (%)",
            "tool success over training",
            100.0,
        )
        _curves(axes[2], runs_by_arm, arms, colors, ACC_KEY, w, "rollout/acc_mean (%)", acc_title, 100.0)
        ax, bottom = axes[3], np.zeros(len(arms))
        for mode, color in (("deliberative", "#238b45"), ("reactive", "#fd8d3c"), ("no_tool", "#bdbdbd")):
            share = np.array([100 * (table[a][f"eval/{mode}_share"].mean or 0.0) for a in arms])
            ax.bar(np.arange(len(arms)), share, 0.6, bottom=bottom, color=color, label=mode.replace("_", " "))
            bottom += share
        ax.set_xticks(np.arange(len(arms)), arms, rotation=20)
        ax.set_ylabel("responses (%)")
        ax.set_title("reasoning modes at evaluation (mean over seeds)", fontsize=10)
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle(f"Ablation: {question}", fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


# --------------------------------------------------------------------------- inputs
def load_runs(training: Sequence[Path], eval_metrics: Sequence[Path], samples: Sequence[Path]) -> dict[str, list[Run]]:
    """arm -> its runs ordered by seed; every run must have a GRPO log and the same benchmarks evaluated."""
    logs: dict[tuple[str, int], Path] = {}
    for path in training:
        arm, seed, _ = locate(path, "training")
        if (arm, seed) in logs:
            raise ValueError(f"two GRPO logs for arm {arm!r} seed {seed}: {logs[arm, seed]} and {path}")
        logs[arm, seed] = path
    evals: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for path in eval_metrics:
        arm, seed, benchmark = locate(path, "eval")
        evals.setdefault((arm, seed), {})[benchmark] = read_json_file(path)
    rows: dict[tuple[str, int], dict[str, list[SampleRecord]]] = {}
    for path in samples:
        arm, seed, benchmark = locate(path, "eval")
        rows.setdefault((arm, seed), {})[benchmark] = [
            SampleRecord.from_mapping(row, f"{path} row {i}") for i, row in enumerate(read_jsonl(path))
        ]
    benchmark_sets = {key: sorted(v) for key, v in evals.items()}
    expected = next(iter(benchmark_sets.values()), None)
    for key in sorted(set(logs) | set(evals) | set(rows)):
        where = f"arm {key[0]!r} seed {key[1]}"
        if key not in logs:
            raise ValueError(f"{where}: evaluation files but no GRPO log (<arm>/seed<k>/rl/metrics.jsonl)")
        if benchmark_sets.get(key) != expected or sorted(rows.get(key, {})) != expected:
            raise ValueError(
                f"{where}: metrics.json for {benchmark_sets.get(key)} and samples.jsonl for "
                f"{sorted(rows.get(key, {}))}; every run needs both for {expected}"
            )
    runs: dict[str, list[Run]] = {}
    for arm, seed in sorted(logs):
        records = read_metrics(logs[arm, seed])
        runs.setdefault(arm, []).append(
            Run(arm, seed, records, str(logs[arm, seed]), evals[arm, seed], rows[arm, seed])
        )
    return runs


def write_ablations(cfg: AblationsConfig, runs_by_arm: Mapping[str, Sequence[Run]], out_dir: Path) -> list[Path]:
    """``<question>.md``, ``.csv`` and ``.png`` for each question; returns the paths written."""
    check_ablations(cfg)
    wanted = {arm for q in QUESTIONS for arm in getattr(cfg.questions, q)}
    missing = {arm: [s for s in cfg.seeds if s not in {r.seed for r in runs_by_arm.get(arm, [])}] for arm in wanted}
    missing = {arm: seeds for arm, seeds in missing.items() if seeds}
    if missing:
        raise ValueError(
            f"runs missing for (arm: seeds) {missing}; the questions need seeds {list(cfg.seeds)} of every arm"
        )
    first = next(iter(runs_by_arm[sorted(wanted)[0]]))
    benchmarks = list(first.evals)
    sample_counts = {
        int(m["samples_per_problem"]) for runs in runs_by_arm.values() for r in runs for m in r.evals.values()
    }
    if len(sample_counts) != 1:
        raise ValueError(
            f"runs were evaluated with different samples per problem {sorted(sample_counts)}; avg@n needs one n"
        )
    n = sample_counts.pop()
    per_seed = {arm: [run_metrics(r, cfg) for r in runs_by_arm[arm] if r.seed in cfg.seeds] for arm in wanted}
    table = aggregate(per_seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for question in QUESTIONS:
        arms = list(getattr(cfg.questions, question))
        md, csv, png = (out_dir / f"{question}.{ext}" for ext in ("md", "csv", "png"))
        md.write_text(question_markdown(question, arms, table, benchmarks, n, cfg), encoding="utf-8")
        question_frame(question, arms, table, per_seed, cfg).to_csv(csv, index=False)
        plot_question(question, arms, runs_by_arm, table, benchmarks, n, cfg, png)
        written += [md, csv, png]
    return written
