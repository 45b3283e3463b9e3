"""The summary table: models x benchmarks x metrics, and the published figures beside ours.

Rows come from ``results/eval/<model>/<benchmark>/metrics.json`` (the evaluate stage; the
self-contained half in ``results/eval/<model>/self_contained/<benchmark>/``); the half is the
``run.reasoning`` the file records (``agentic`` when it records none), the model and benchmark
are the folder names above the file, as the workflow lays them out. Values are percentages.
Published figures (the released models' avg@32, ``resources/published.yaml``, each citing its
model card, per half of the card's table) are compared with the evaluated models that config
``eval.published`` maps to them, half by half: the released DemyAgent-4B evaluated here, or our
``rl`` stage that reproduces it; the difference is measured minus published, in points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from agentrl.errors import DataFormatError, read_json_file
from agentrl.sampling.metrics import DELIBERATIVE_MAX_CALLS, DELIBERATIVE_MIN_TOKENS_PER_CALL

PUBLISHED_PATH = Path(__file__).resolve().parents[1] / "resources" / "published.yaml"
# The halves of the model card's table, in its order, and their titles there.
REASONING_TITLES = {"self_contained": "Self-contained reasoning (no tool)", "agentic": "Agentic reasoning (code tool)"}


@dataclass(frozen=True)
class PublishedModel:
    """The published figures of one released model (an entry of ``published.yaml``):
    ``figures`` maps a half of the table (``agentic``, ``self_contained``) to benchmark -> percent."""

    name: str
    source: str
    metric: str
    n: int
    sampling: str
    figures: dict[str, dict[str, float]]

    def figure(self, reasoning: str, benchmark: str) -> float | None:
        return self.figures.get(reasoning, {}).get(benchmark)


def _read_yaml(path: Path) -> Any:
    """The YAML value of ``path``; an unreadable file or bad YAML raises DataFormatError naming the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{path}: cannot be read ({exc})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise DataFormatError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None


def read_published(path: str | Path = PUBLISHED_PATH) -> dict[str, PublishedModel]:
    """The entries of a published-figures file, checked: every key present, the halves known,
    every figure a percentage. A broken file raises DataFormatError naming it and the entry."""
    path = Path(path)
    raw = _read_yaml(path) or {}
    if not isinstance(raw, dict):
        raise DataFormatError(f"{path}: expected a mapping of model -> entry, got {type(raw).__name__}")
    models = {}
    for name, entry in raw.items():
        entry = entry if isinstance(entry, dict) else {}
        missing = [key for key in ("source", "metric", "n", "sampling", "figures") if key not in entry]
        if missing:
            raise DataFormatError(
                f"{path}: entry {name!r} lacks key(s) {missing}; each entry has source, metric, n, sampling and figures"
            )
        halves = entry["figures"]
        if not isinstance(halves, dict) or not halves or set(halves) - set(REASONING_TITLES):
            raise DataFormatError(
                f"{path}: {name}.figures must map halves of the table ({', '.join(REASONING_TITLES)}) "
                f"to benchmark -> percent, got {halves!r}"
            )
        for reasoning, figures in halves.items():
            if not isinstance(figures, (dict, type(None))):
                raise DataFormatError(f"{path}: {name}.figures.{reasoning} must map benchmark -> percent")
            for benchmark, value in (figures or {}).items():
                if not isinstance(value, (int, float)) or not 0 <= value <= 100:
                    raise DataFormatError(
                        f"{path}: {name}.figures.{reasoning}.{benchmark} = {value!r} is not a percentage"
                    )
        models[name] = PublishedModel(
            name=name,
            source=" ".join(str(entry["source"]).split()),
            metric=str(entry["metric"]),
            n=int(entry["n"]),
            sampling=str(entry["sampling"]),
            figures={str(h): {str(b): float(v) for b, v in (f or {}).items()} for h, f in halves.items()},
        )
    return models


@dataclass(frozen=True)
class EvalResult:
    model: str
    benchmark: str
    metrics: dict[str, Any]
    reasoning: str = "agentic"

    @property
    def label(self) -> str:
        """The model as plots and tables name one row: the half added when it is not agentic."""
        return self.model if self.reasoning == "agentic" else f"{self.model} (self-contained)"


def read_eval_results(paths: Sequence[str | Path]) -> list[EvalResult]:
    """Load metrics.json files laid out as ``.../eval/<model>/<benchmark>/metrics.json``, or
    ``.../eval/<model>/self_contained/<benchmark>/metrics.json`` for the self-contained half."""
    results = []
    for path in map(Path, paths):
        if path.name != "metrics.json" or len(path.parts) < 3:
            raise DataFormatError(f"{path}: expected a path ending in <model>/<benchmark>/metrics.json")
        metrics = read_json_file(path)
        if not isinstance(metrics, dict):
            raise DataFormatError(f"{path}: expected a JSON object, got {type(metrics).__name__}")
        missing = _missing_metrics(metrics)
        if missing:
            raise DataFormatError(
                f"{path}: missing key {missing[0]!r}; was it written by `agentrl evaluate run`? Write it again "
                "(snakemake --forcerun gather_evaluation)"
            )
        reasoning = (metrics.get("run") or {}).get("reasoning", "agentic")
        if reasoning not in REASONING_TITLES:
            raise DataFormatError(f"{path}: run.reasoning is {reasoning!r}; known: {', '.join(REASONING_TITLES)}")
        model_dir = path.parent.parent
        if reasoning != "agentic":
            if model_dir.name != reasoning or len(path.parts) < 4:
                raise DataFormatError(
                    f"{path}: a {reasoning} evaluation, expected a path ending in <model>/{reasoning}/<benchmark>/metrics.json"
                )
            model_dir = model_dir.parent
        results.append(EvalResult(model_dir.name, path.parent.name, metrics, reasoning))
    seen = [(r.model, r.reasoning, r.benchmark) for r in results]
    if len(set(seen)) != len(seen):
        raise DataFormatError(f"the same (model, reasoning, benchmark) is given twice: {seen}")
    return results


def _missing_metrics(metrics: dict[str, Any]) -> list[str]:
    """The keys (dotted paths) of a metrics.json the report reads and it lacks, in reading order."""
    missing = [
        key for key in ("samples_per_problem", "pass@k", "upstream_bootstrap", "ci", "tool_use") if key not in metrics
    ]
    if missing:
        return missing
    n = metrics["samples_per_problem"]
    paths = ["num_problems", f"avg@{n}", f"ci.avg@{n}", f"pass@k.{n}"]
    paths += [f"tool_use.{key}" for key in ("tool_calls_per_response", "tool_success_rate", "response_tokens")]
    paths += [f"tool_use.modes.{mode}.share" for mode in ("deliberative", "reactive")]
    return [path for path in paths if not _holds(metrics, path)]


def _holds(mapping: Any, dotted: str) -> bool:
    """Whether ``mapping`` has the key path ``dotted`` (``ci.avg@4``: a key may hold '@', never '.')."""
    for part in dotted.split("."):
        if not isinstance(mapping, dict) or part not in mapping:
            return False
        mapping = mapping[part]
    return True


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
        "reasoning": result.reasoning,
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
    """One row per (model, reasoning, benchmark); where ``published`` maps the model to a released
    model, the entry (``published_as``), its figure for the row's half and benchmark
    (``published``, None where the card has none) and ``difference`` = avg@n - published, in points."""
    published = published or {}
    rows = []
    for result in results:
        row = metric_row(result)
        entry = published.get(result.model)
        figure = entry.figure(result.reasoning, result.benchmark) if entry else None
        row["published_as"] = entry.name if entry else None
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
    halves = _with_halves(frame)
    rows = []
    for (model, reasoning), group in frame.groupby(["model", "reasoning"], sort=False):
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
        rows.append([model, *([reasoning] if halves else []), *cells])
    header = ["model", *(["reasoning"] if halves else []), *benchmarks, *(["mean"] if with_mean else [])]
    return markdown_table(header, rows)


def _with_halves(frame: pd.DataFrame) -> bool:
    """Whether the tables name the half: only when a row is not agentic."""
    return bool((frame["reasoning"] != "agentic").any())


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
    columns = list(DETAIL_COLUMNS)
    if _with_halves(frame):
        columns.insert(1, ("reasoning", "reasoning"))
    parts = []
    for benchmark, group in ours.groupby("benchmark", sort=False):
        rows = [[r[key] for key, _ in columns] for r in group.to_dict("records")]
        parts.append(f"### {benchmark}\n\n" + markdown_table([label for _, label in columns], rows))
    return "\n\n".join(parts)


def legend_markdown(n_values: Sequence[int]) -> str:
    """What each column of the tables means, and what a ``-`` there says (metrics.json's keys:
    :func:`agentrl.sampling.metrics.summarize_benchmark`)."""
    n = ", ".join(map(str, n_values))
    calls, tokens = DELIBERATIVE_MAX_CALLS, DELIBERATIVE_MIN_TOKENS_PER_CALL
    rows = [
        ("n", f"samples per problem (eval.n; here {n})"),
        (
            "avg@n",
            "share of the n samples that are correct, averaged over problems; [low, high] is the 95 % "
            "percentile-bootstrap interval of that mean over problems (which problems the benchmark holds, "
            "not the sampling noise)",
        ),
        ("pass@n (unbiased)", "share of problems with at least one correct sample among the n"),
        (
            "pass@n (verl bootstrap)",
            "pass@n as upstream (verl's best@n) computes it, the paper's pass@32: the best of n samples drawn "
            "with replacement from the problem's n, averaged over draws; below the unbiased value (a problem "
            "with 1 correct sample of 32 counts 0.64, not 1)",
        ),
        (
            "maj@n",
            "share of problems whose most frequent extracted answer among the n samples is correct (a sample "
            "with no answer does not vote); `-` when no sample of the benchmark had an answer the verifier "
            "could extract (e.g. no `\\boxed{}`)",
        ),
        ("tool calls / response", "mean tool calls per response"),
        ("tool success %", "share of the tool calls whose program ran and exited 0; `-` when no call was made"),
        (
            "deliberative %",
            f"share of responses with 1 to {calls} tool calls and at least {tokens} tokens of the model's own "
            "text before each call on average: few, planned calls (the paper's deliberative mode)",
        ),
        (
            "reactive %",
            f"share of responses with tool calls that are not deliberative: more than {calls} calls, or under "
            f"{tokens} tokens before a call on average. The rest, 100 - deliberative - reactive, called no tool",
        ),
        ("response tokens", "mean tokens the model generated per response (tool responses not counted)"),
    ]
    return markdown_table(["column", "meaning"], rows) + "\n\nA `-` elsewhere: no value (none was measured)."


def _compared_row(r: Mapping[str, Any]) -> list[Any]:
    figure = None if pd.isna(r["published"]) else r["published"]
    return [
        r["model"],
        r["published_as"],
        r["benchmark"],
        f"{r['avg@n']:.1f} [{r['avg@n_ci_low']:.1f}, {r['avg@n_ci_high']:.1f}] (n = {int(r['n'])})",
        figure,
        None if figure is None else f"{r['difference']:+.1f}",
        None if figure is None else ("yes" if r["avg@n_ci_low"] <= figure <= r["avg@n_ci_high"] else "no"),
    ]


def published_markdown(frame: pd.DataFrame, published: Mapping[str, PublishedModel]) -> str:
    """Measured beside published, one table per half of the model card's table (its order, its
    titles), with the rows of every model mapped to a published entry (``-`` where the card has
    no figure for that half and benchmark), and the sources."""
    mapped = frame[frame["published_as"].notna()] if "published_as" in frame else frame.iloc[0:0]
    header = ["model", "published as", "benchmark", "measured avg@n [95 % CI]", "published", "difference", "in CI"]
    parts = []
    for reasoning, title in REASONING_TITLES.items():
        half = mapped[mapped["reasoning"] == reasoning]
        if len(half):
            parts.append(
                f"### {title}\n\n" + markdown_table(header, [_compared_row(r) for r in half.to_dict("records")])
            )
    by_name = {entry.name: entry for entry in published.values()}
    used = [by_name[name] for name in dict.fromkeys(mapped["published_as"])]
    sources = [f"- {e.name}: {e.metric} ({e.sampling}); {e.source}" for e in used]
    return "\n\n".join(parts) + "\n\nDifference = measured - published, in points. Sources:\n" + "\n".join(sources)


FILTER_STATS_KEYS = [
    *(
        f"{stage}.{bucket}"
        for stage in ("scored", "in_band", "selected")
        for bucket in ("total", "easy", "medium", "hard")
    ),
    *(f"thresholds.{name}" for name in ("low", "high", "easy_min", "hard_max")),
    "dropped_at_or_below_low",
    "dropped_at_or_above_high",
    "resampled_out",
]


def read_filter_stats(path: str | Path) -> dict[str, Any]:
    """The filter stage's stats.json with every key :func:`filter_markdown` reads; else
    DataFormatError naming the file and the first key it lacks."""
    stats = read_json_file(path)
    missing = [key for key in FILTER_STATS_KEYS if not _holds(stats, key)]
    if missing:
        raise DataFormatError(
            f"{path}: missing key {missing[0]!r}; was it written by `agentrl filter select`? Write it again "
            "(snakemake --forcerun select_rl_data)"
        )
    return stats


def filter_markdown(stats: Mapping[str, Any]) -> str:
    """Counts per difficulty bucket through the selection (the filter stage's stats.json)."""
    stages = [("scored", stats["scored"]), ("in band", stats["in_band"]), ("selected", stats["selected"])]
    rows = [[name, c["total"], c["easy"], c["medium"], c["hard"]] for name, c in stages]
    t = stats["thresholds"]
    note = (
        f"Band: {t['low']:g} < pass rate < {t['high']:g}; easy >= {t['easy_min']:g}, hard <= {t['hard_max']:g}. "
        f"Dropped at or below the band: {stats['dropped_at_or_below_low']}, at or above: "
        f"{stats['dropped_at_or_above_high']}, resampled out: {stats['resampled_out']}"
    )
    if stats.get("balance_sources"):  # absent in the stats of runs before filter.balance_sources
        note += f", balanced out (filter.balance_sources): {stats['source_balanced_out']}"
    note += "."
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
    tables: Sequence[tuple[str, str]] = (),
    note: str | None = None,
) -> str:
    """The whole summary.md: the run's note (config ``report.note``) first, headline table, the
    published comparison, the sources of models not trained here, details and the legend of their
    columns, filtering counts, links to the other tables (``tables``: title, relative path of a
    markdown file such as health.md and cost.md) and the plots by relative path. A table is a
    link, never an image: ``![..](health.md)`` renders as a broken picture."""
    n_values = sorted({int(v) for v in frame.loc[frame["source"] == "ours", "n"]})
    parts = [
        "# agentrl run summary",
        *([f"> **Note:** {' '.join(note.split())}"] if note and note.strip() else []),
        f"## Accuracy (avg@n in %, n = {', '.join(map(str, n_values))}; [95 % bootstrap interval over problems])",
        headline_markdown(frame),
    ]
    gradings = sorted(set(frame.loc[frame["source"] == "ours", "grading"]))
    parts.append(
        f"Grading: {'; '.join(gradings)} (reward.math_mode, reward.choice_mode; "
        "'math strict, choice exact' is upstream's strict box check, docs/fidelity.md)."
    )
    if published and frame["published_as"].notna().any():
        parts += ["## Measured and published", published_markdown(frame, published)]
    if sources:
        parts += ["## Models not trained here", sources_markdown(sources)]
    parts += [
        "## Metrics per benchmark",
        detail_markdown(frame),
        "## What the columns mean",
        legend_markdown(n_values),
    ]
    if filter_stats is not None:
        parts += ["## Model-aware RL data", filter_markdown(filter_stats)]
    if tables:
        parts += ["## More tables", "\n".join(f"- [{title}]({path})" for title, path in tables)]
    if plots:
        parts += ["## Plots", "\n\n".join(f"![{title}]({path})" for title, path in plots)]
    return "\n\n".join(parts) + "\n"
