"""The summary table: models x benchmarks x metrics, and the published figures beside ours.

Rows come from ``results/eval/<model>/<benchmark>/metrics.json`` (the evaluate stage); the model
and benchmark are the two folder names above the file, as the workflow lays them out. Values
are percentages. Published figures (the released models' avg@32, ``resources/published.yaml``,
each citing its model card) are compared with the evaluated models that config
``eval.published`` maps to them: the released DemyAgent-4B evaluated here, or our ``rl`` stage
that reproduces it; the difference is measured minus published, in points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from agentrl.errors import DataFormatError, read_json_file

PUBLISHED_PATH = Path(__file__).resolve().parents[1] / "resources" / "published.yaml"


@dataclass(frozen=True)
class PublishedModel:
    """The published figures of one released model (an entry of ``published.yaml``)."""

    name: str
    source: str
    metric: str
    n: int
    sampling: str
    figures: dict[str, float]


def read_published(path: str | Path = PUBLISHED_PATH) -> dict[str, PublishedModel]:
    """The entries of a published-figures file, checked: every key present, every figure a percentage."""
    path = Path(path)
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of model -> entry, got {type(raw).__name__}")
    models = {}
    for name, entry in raw.items():
        missing = [key for key in ("source", "metric", "n", "sampling", "figures") if key not in (entry or {})]
        if missing:
            raise ValueError(f"{path}: entry {name!r} lacks key(s) {missing}")
        for benchmark, value in entry["figures"].items():
            if not isinstance(value, (int, float)) or not 0 <= value <= 100:
                raise ValueError(f"{path}: {name}.figures.{benchmark} = {value!r} is not a percentage")
        models[name] = PublishedModel(
            name=name,
            source=" ".join(str(entry["source"]).split()),
            metric=str(entry["metric"]),
            n=int(entry["n"]),
            sampling=str(entry["sampling"]),
            figures={str(b): float(v) for b, v in entry["figures"].items()},
        )
    return models


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


def summary_frame(results: Sequence[EvalResult], published: Mapping[str, PublishedModel] | None = None) -> pd.DataFrame:
    """One row per (model, benchmark); where ``published`` maps the model to a released model that
    reports the benchmark, its figure (``published``), the entry (``published_as``) and
    ``difference`` = avg@n - published, in points."""
    published = published or {}
    rows = []
    for result in results:
        row = metric_row(result)
        entry = published.get(result.model)
        figure = entry.figures.get(result.benchmark) if entry else None
        row["published_as"] = entry.name if figure is not None else None
        row["published"] = figure
        row["difference"] = None if figure is None else round(row["avg@n"] - figure, 2)
        rows.append(row)
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
    """Models x benchmarks, avg@n in percent with its 95 % interval, and with several benchmarks
    their unweighted mean (``-`` for a model missing one)."""
    benchmarks = list(dict.fromkeys(frame["benchmark"]))
    with_mean = len(benchmarks) > 1
    rows = []
    for model, group in frame.groupby("model", sort=False):
        by_bench = {r["benchmark"]: r for r in group.to_dict("records")}
        cells = []
        for benchmark in benchmarks:
            r = by_bench.get(benchmark)
            if r is None:
                cells.append("-")
            else:
                cells.append(f"{r['avg@n']:.1f} [{r['avg@n_ci_low']:.1f}, {r['avg@n_ci_high']:.1f}]")
        if with_mean:
            complete = all(b in by_bench for b in benchmarks)
            cells.append(f"{sum(by_bench[b]['avg@n'] for b in benchmarks) / len(benchmarks):.1f}" if complete else "-")
        rows.append([model, *cells])
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


def published_markdown(frame: pd.DataFrame, published: Mapping[str, PublishedModel]) -> str:
    """Measured beside published, per (model, benchmark) with a published figure, and the sources."""
    compared = frame[frame["published"].notna()] if "published" in frame else frame.iloc[0:0]
    rows = [
        [
            r["model"],
            r["published_as"],
            r["benchmark"],
            f"{r['avg@n']:.1f} [{r['avg@n_ci_low']:.1f}, {r['avg@n_ci_high']:.1f}] (n = {int(r['n'])})",
            r["published"],
            f"{r['difference']:+.1f}",
            "yes" if r["avg@n_ci_low"] <= r["published"] <= r["avg@n_ci_high"] else "no",
        ]
        for r in compared.to_dict("records")
    ]
    header = ["model", "published as", "benchmark", "measured avg@n [95 % CI]", "published", "difference", "in CI"]
    by_name = {entry.name: entry for entry in published.values()}
    used = [by_name[name] for name in dict.fromkeys(compared["published_as"])]
    sources = [f"- {e.name}: {e.metric} ({e.sampling}); {e.source}" for e in used]
    return (
        markdown_table(header, rows)
        + "\n\nDifference = measured - published, in points. Sources:\n"
        + "\n".join(sources)
    )


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


def sources_markdown(sources: Mapping[str, Mapping[str, Any]]) -> str:
    """Where each linked or downloaded model came from: id, revision asked for, commit it resolved to."""
    rows = [
        [model, src.get("id"), src.get("revision") or "-", src.get("commit") or "-"] for model, src in sources.items()
    ]
    return markdown_table(["model", "source", "revision", "commit"], rows)


def summary_markdown(
    frame: pd.DataFrame,
    filter_stats: Mapping[str, Any] | None,
    plots: Sequence[tuple[str, str]],
    published: Mapping[str, PublishedModel] | None = None,
    sources: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The whole summary.md: headline table, the published comparison, the sources of models not
    trained here, details, filtering counts, the plots by relative path."""
    n_values = sorted({int(v) for v in frame.loc[frame["source"] == "ours", "n"]})
    parts = [
        "# agentrl run summary",
        f"## Accuracy (avg@n in %, n = {', '.join(map(str, n_values))}; [95 % bootstrap interval over problems])",
        headline_markdown(frame),
    ]
    gradings = sorted(set(frame.loc[frame["source"] == "ours", "grading"]))
    parts.append(
        f"Grading: {'; '.join(gradings)} (reward.math_mode, reward.choice_mode; "
        "'math strict, choice exact' is upstream's strict box check, docs/fidelity.md)."
    )
    if published and frame["published"].notna().any():
        parts += ["## Measured and published", published_markdown(frame, published)]
    if sources:
        parts += ["## Models not trained here", sources_markdown(sources)]
    parts += [
        "## Metrics per benchmark",
        detail_markdown(frame),
    ]
    if filter_stats is not None:
        parts += ["## Model-aware RL data", filter_markdown(filter_stats)]
    if plots:
        parts += ["## Plots", "\n\n".join(f"![{title}]({path})" for title, path in plots)]
    return "\n\n".join(parts) + "\n"
