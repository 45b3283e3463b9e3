"""The ablation tables and plots: the paper's three questions (data, algorithm, reasoning mode).

``python -m agentrl report ablations`` reads what ``snakemake ablations`` (rules/ablations.smk)
wrote, laid out as

- ``.../<arm>/seed<k>/rl/metrics.jsonl``: the GRPO log of one arm and seed;
- ``.../<arm>/seed<k>/eval/<benchmark>/{metrics.json,samples.jsonl}``: its final model's evaluation,

and writes, for each question of ``ablations.questions``, ``<question>.md`` (tables), ``<question>.csv``
(long format: ``kind = spread`` rows, one per arm and metric with the per-seed values, and
``kind = effect`` rows, one per other arm and metric with its effect against the reference arm) and
``<question>.png`` (training accuracy and policy entropy over steps per arm, among other panels).

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
  at the first and the last step;
- ``eval/tool_calls_per_solved``: tool calls over all evaluation samples / correct samples (None
  when none is correct);
- from the GRPO log, None where an older log lacks the key: ``train/entropy_last`` (mean
  ``actor/entropy`` of the last 3 steps), ``train/clip_frac_high_mean`` / ``_low_mean`` and
  ``train/zero_advantage_share_mean`` (``actor/clip_frac_*``, ``rollout/zero_advantage_share``,
  mean over all steps).

Per arm (:func:`aggregate`): mean, sample standard deviation (ddof = 1; none for a single
seed), min and max over seeds; ``steps_to_reach`` over the seeds that reached the threshold, with
how many did. Rates are shown in percent.

Per other arm of a question, its effect against the question's first (reference) arm, paired over
seeds: the mean difference and its 95 % t-interval (:mod:`agentrl.report.ablation_effects`).
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

import numpy as np
import pandas as pd

from agentrl.config import AblationsConfig, ConfigError
from agentrl.errors import read_json_file
from agentrl.report.ablation_effects import Effect, effect_columns, effect_rows, effects_section, question_effects
from agentrl.report.ablation_plots import ACC_KEY, CALLS_KEY, CURVE_KEYS, ENTROPY_KEY, SUCCESS_KEY, Band, plot_question
from agentrl.sampling.metrics import SampleRecord, tool_use_stats
from agentrl.sampling.samples import read_jsonl
from agentrl.training.metrics import read_metrics

log = logging.getLogger("agentrl.report.ablations")

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


def step_mean(records: Sequence[Mapping[str, Any]], key: str, source: str, last: int | None = None) -> float | None:
    """Mean of ``key`` over the training steps (the ``last`` ones only if given); None when no step logs it."""
    if not any(key in r and "step" in r for r in records):
        return None
    _, values = training_curve(records, key, source)
    return float(np.mean(values[-last:] if last else values))


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
    solved = sum(r.acc for r in records)
    out["eval/tool_calls_per_solved"] = sum(r.tool_calls for r in records) / solved if solved else None
    for key, name, last in (
        (ENTROPY_KEY, "entropy_last", 3),
        ("actor/clip_frac_high", "clip_frac_high_mean", None),
        ("actor/clip_frac_low", "clip_frac_low_mean", None),
        ("rollout/zero_advantage_share", "zero_advantage_share_mean", None),
    ):
        out[f"train/{name}"] = step_mean(run.training, key, run.training_source, last)
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
        metric == "steps_to_reach" or metric.startswith(("train/tool_calls", "eval/tool_calls", "train/entropy"))
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
    effects: Mapping[str, Mapping[str, Effect]],
) -> str:
    """The markdown of one question: the final evaluation and training tables (data, algorithm), or tool use
    (reasoning), then each other arm's effects against the first (``effects``: :func:`question_effects`)."""
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
    columns = effect_columns(question, n, cfg.accuracy_threshold)
    parts += effects_section(arms, effects, columns, {a: _arm_label(a, cfg) for a in arms}, len(cfg.seeds))
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
    effects: Mapping[str, Mapping[str, Effect]],
) -> pd.DataFrame:
    """Long format (fractions, not %): ``kind = spread`` rows, one per (arm, metric) with the spread and the
    per-seed values, then ``kind = effect`` rows (:func:`agentrl.report.ablation_effects.effect_rows`)."""
    columns = {a: {k: getattr(cfg.arms[a], k) for k in ("sft_data", "rl_data", "variant")} for a in arms}
    rows = []
    for arm in arms:
        for metric, s in table[arm].items():
            rows.append(
                {
                    "question": question,
                    "kind": "spread",
                    "arm": arm,
                    **columns[arm],
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
    return pd.DataFrame(rows + effect_rows(question, arms, effects, sorted(cfg.seeds), columns))


# --------------------------------------------------------------------------- curves over seeds
def seed_band(runs: Sequence[Run], key: str, window: int) -> Band | None:
    """``(steps, mean, min, max, seeds)`` over the runs whose log has ``key`` (None when none has: older logs
    lack ``actor/entropy``) of the smoothed ``key``, at every step some seed logged."""
    curves = []
    for run in runs:
        if any(key in r and "step" in r for r in run.training):
            steps, values = training_curve(run.training, key, run.training_source)
            curves.append(dict(zip(steps, smooth(values, window))))
    if not curves:
        return None
    steps = np.array(sorted({s for c in curves for s in c}))
    at = [[c[s] for c in curves if s in c] for s in steps]
    mean, low, high = (np.array([f(v) for v in at]) for f in (np.mean, min, max))
    return Band(steps, mean, low, high, len(curves))


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
    runs = {arm: [r for r in runs_by_arm[arm] if r.seed in cfg.seeds] for arm in wanted}
    per_seed = {arm: [run_metrics(r, cfg) for r in runs[arm]] for arm in wanted}
    by_seed = {arm: {r.seed: m for r, m in zip(runs[arm], per_seed[arm])} for arm in wanted}
    table = aggregate(per_seed)
    w = cfg.smoothing_window
    bands = {arm: {key: seed_band(runs[arm], key, w) for key in CURVE_KEYS} for arm in wanted}
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for question in QUESTIONS:
        arms = list(getattr(cfg.questions, question))
        md, csv, png = (out_dir / f"{question}.{ext}" for ext in ("md", "csv", "png"))
        effects = question_effects(arms, by_seed, effect_columns(question, n, cfg.accuracy_threshold))
        md.write_text(question_markdown(question, arms, table, benchmarks, n, cfg, effects), encoding="utf-8")
        question_frame(question, arms, table, per_seed, cfg, effects).to_csv(csv, index=False)
        plot_question(question, arms, bands, table, benchmarks, n, cfg, png)
        written += [md, csv, png]
    return written
