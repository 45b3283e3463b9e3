"""The summary table: models x benchmarks x metrics, with the paper's Table 2 beside ours.

Rows come from ``results/eval/<model>/<benchmark>/metrics.json`` (the evaluate stage); the model
and benchmark are the two folder names above the file, as the workflow lays them out. Values
are percentages. For the paper's benchmarks the paper's Table 2 numbers (mean accuracy over 32
samples, docs/recipe.md section 7) appear as extra rows: DemyAgent-4B is what our ``rl`` stage
reproduces, Qwen3-4B-Instruct-2507 used agentically without RL is our ``base`` stage under the
paper preset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from agentrl.errors import DataFormatError, read_json_file

# Paper Table 2 (docs/recipe.md section 7): model -> benchmark -> accuracy in percent.
PAPER_TABLE2: dict[str, dict[str, float]] = {
    "DemyAgent-4B (paper; our rl)": {
        "aime2024": 72.6,
        "aime2025": 70.0,
        "gpqa_diamond": 58.5,
        "livecodebench_v6": 26.8,
    },
    "Qwen3-4B-Instruct-2507 agentic, no RL (paper; our base)": {
        "aime2024": 17.9,
        "aime2025": 16.3,
        "gpqa_diamond": 44.3,
        "livecodebench_v6": 23.0,
    },
}


@dataclass(frozen=True)
class EvalResult:
    model: str
    benchmark: str
    metrics: dict[str, Any]


def read_eval_results(paths: Sequence[str | Path]) -> list[EvalResult]:
    """Load metrics.json files laid out as ``.../eval/<model>/<benchmark>/metrics.json``."""
    results = []
    for path in map(Path, paths):
        if path.name != "metrics.json" or len(path.parts) < 3:
            raise DataFormatError(f"{path}: expected a path ending in <model>/<benchmark>/metrics.json")
        metrics = read_json_file(path)
        if not isinstance(metrics, dict):
            raise DataFormatError(f"{path}: expected a JSON object, got {type(metrics).__name__}")
        for key in ("samples_per_problem", "pass@k", "upstream_bootstrap", "ci", "tool_use"):
            if key not in metrics:
                raise DataFormatError(f"{path}: missing key {key!r}; was it written by `agentrl evaluate run`?")
        results.append(EvalResult(model=path.parent.parent.name, benchmark=path.parent.name, metrics=metrics))
    seen = [(r.model, r.benchmark) for r in results]
    if len(set(seen)) != len(seen):
        raise DataFormatError(f"the same (model, benchmark) is given twice: {seen}")
    return results


def _pct(value: float | None) -> float | None:
    return None if value is None else round(100.0 * float(value), 2)


def metric_row(result: EvalResult) -> dict[str, Any]:
    """One CSV row: the headline metrics of one (model, benchmark), in percent where a rate."""
    m = result.metrics
    n = int(m["samples_per_problem"])
    tool = m["tool_use"]
    maj = m.get("maj@k", {}).get(str(n))
    return {
        "source": "ours",
        "model": result.model,
        "benchmark": result.benchmark,
        "problems": m["num_problems"],
        "n": n,
        "avg@n": _pct(m[f"avg@{n}"]),
        "avg@n_ci_low": _pct(m["ci"][f"avg@{n}"][0]),
        "avg@n_ci_high": _pct(m["ci"][f"avg@{n}"][1]),
        "pass@n": _pct(m["pass@k"][str(n)]),
        "best@n_upstream": _pct(m["upstream_bootstrap"].get(f"best@{n}")),
        "maj@n": _pct(maj),
        "maj@n_upstream": _pct(m["upstream_bootstrap"].get(f"maj@{n}")),
        "tool_calls_per_response": round(tool["tool_calls_per_response"], 3),
        "tool_success_rate": _pct(tool["tool_success_rate"]),
        "deliberative_share": _pct(tool["modes"]["deliberative"]["share"]),
        "reactive_share": _pct(tool["modes"]["reactive"]["share"]),
        "response_tokens": round(tool["response_tokens"], 1),
        "grading": grading_label(m.get("run", {}).get("grading")),
    }


def grading_label(grading: Mapping[str, str] | None) -> str:
    """How answers were graded (reward.math_mode / choice_mode), e.g. ``math strict, choice exact``."""
    if not grading:
        return "unrecorded"
    return f"math {grading['math_mode']}, choice {grading['choice_mode']}"


def summary_frame(results: Sequence[EvalResult]) -> pd.DataFrame:
    """Our rows, then the paper's Table 2 rows for the benchmarks we evaluated that it reports."""
    rows = [metric_row(r) for r in results]
    benchmarks = list(dict.fromkeys(r.benchmark for r in results))
    for model, numbers in PAPER_TABLE2.items():
        for benchmark in benchmarks:
            if benchmark in numbers:
                rows.append(
                    {
                        "source": "paper Table 2",
                        "model": model,
                        "benchmark": benchmark,
                        "n": 32,
                        "avg@n": numbers[benchmark],
                    }
                )
    return pd.DataFrame(rows)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def headline_markdown(frame: pd.DataFrame) -> str:
    """Models (ours, then the paper's) x benchmarks, avg@n in percent with our 95 % interval, and
    with several benchmarks their unweighted mean (``-`` for a model missing one)."""
    benchmarks = list(dict.fromkeys(frame["benchmark"]))
    with_mean = len(benchmarks) > 1
    rows = []
    for (source, model), group in frame.groupby(["source", "model"], sort=False):
        by_bench = {r["benchmark"]: r for r in group.to_dict("records")}
        cells = []
        for benchmark in benchmarks:
            r = by_bench.get(benchmark)
            if r is None:
                cells.append("-")
            elif source == "ours":
                cells.append(f"{r['avg@n']:.1f} [{r['avg@n_ci_low']:.1f}, {r['avg@n_ci_high']:.1f}]")
            else:
                cells.append(f"{r['avg@n']:.1f}")
        if with_mean:
            complete = all(b in by_bench for b in benchmarks)
            cells.append(f"{sum(by_bench[b]['avg@n'] for b in benchmarks) / len(benchmarks):.1f}" if complete else "-")
        rows.append([model if source == "ours" else f"*{model}*", *cells])
    return markdown_table(["model", *benchmarks, *(["mean"] if with_mean else [])], rows)


DETAIL_COLUMNS = (
    ("model", "model"),
    ("n", "n"),
    ("avg@n", "avg@n"),
    ("pass@n", "pass@n (unbiased)"),
    ("best@n_upstream", "pass@n (verl bootstrap)"),
    ("maj@n", "maj@n"),
    ("tool_calls_per_response", "tool calls / response"),
    ("tool_success_rate", "tool success %"),
    ("deliberative_share", "deliberative %"),
    ("reactive_share", "reactive %"),
    ("response_tokens", "response tokens"),
)


def detail_markdown(frame: pd.DataFrame) -> str:
    """Per benchmark: every metric of every model of ours."""
    ours = frame[frame["source"] == "ours"]
    parts = []
    for benchmark, group in ours.groupby("benchmark", sort=False):
        rows = [[r[key] for key, _ in DETAIL_COLUMNS] for r in group.to_dict("records")]
        parts.append(f"### {benchmark}\n\n" + markdown_table([label for _, label in DETAIL_COLUMNS], rows))
    return "\n\n".join(parts)


def filter_markdown(stats: Mapping[str, Any]) -> str:
    """Counts per difficulty bucket through the selection (the filter stage's stats.json)."""
    stages = [("scored", stats["scored"]), ("in band", stats["in_band"]), ("selected", stats["selected"])]
    rows = [[name, c["total"], c["easy"], c["medium"], c["hard"]] for name, c in stages]
    t = stats["thresholds"]
    note = (
        f"Band: {t['low']:g} < pass rate < {t['high']:g}; easy >= {t['easy_min']:g}, hard <= {t['hard_max']:g}. "
        f"Dropped at or below the band: {stats['dropped_at_or_below_low']}, at or above: "
        f"{stats['dropped_at_or_above_high']}, resampled out: {stats['resampled_out']}."
    )
    return markdown_table(["RL pool", "problems", "easy", "medium", "hard"], rows) + "\n\n" + note


def summary_markdown(
    frame: pd.DataFrame, filter_stats: Mapping[str, Any] | None, plots: Sequence[tuple[str, str]]
) -> str:
    """The whole summary.md: headline table, details, filtering counts, the plots by relative path."""
    n_values = sorted({int(v) for v in frame.loc[frame["source"] == "ours", "n"]})
    parts = [
        "# agentrl run summary",
        f"## Accuracy (avg@n in %, n = {', '.join(map(str, n_values))}; [95 % bootstrap interval over problems])",
        headline_markdown(frame),
    ]
    if (frame["source"] != "ours").any():
        parts.append(
            "Rows in italics are the paper's Table 2 (mean accuracy of 32 samples); they compare with "
            "the paper preset's runs, not with the embedded tiny model."
        )
    gradings = sorted(set(frame.loc[frame["source"] == "ours", "grading"]))
    parts.append(
        f"Grading: {'; '.join(gradings)} (reward.math_mode, reward.choice_mode; "
        "'math strict, choice exact' is upstream's strict box check, docs/fidelity.md)."
    )
    parts += [
        "## Metrics per benchmark",
        detail_markdown(frame),
    ]
    if filter_stats is not None:
        parts += ["## Model-aware RL data", filter_markdown(filter_stats)]
    if plots:
        parts += ["## Plots", "\n\n".join(f"![{title}]({path})" for title, path in plots)]
    return "\n\n".join(parts) + "\n"
