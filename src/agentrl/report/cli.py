"""``python -m agentrl report``: the run's summary table and plots (``results/report/``).

Inputs are explicit paths: the evaluate stage's ``metrics.json`` files (required), and, when
the workflow's config runs those stages, the SFT and RL training logs and the filter stage's
``stats.json``. An absent optional input is not an error because the *rule* decides what exists
(it asks for the RL log only when the config evaluates the RL model); a path that is given
must exist and parse. The pass-rate histogram is the filter stage's own output and enters
``snakemake --report`` from there. ``--published-model MODEL=NAME`` puts the published figures
of ``NAME`` (an entry of ``--published``, by default ``resources/published.yaml``) beside the
measured ones of ``MODEL`` (config ``eval.published``). ``--note`` (config ``report.note``) opens
summary.md with what a reader must know before the numbers: the smoke preset's says they mean
nothing, so that its report is never quoted as a result.

``python -m agentrl report ablations ...`` writes the ablation tables and plots instead
(:mod:`agentrl.report.ablations`), ``python -m agentrl report cost ...`` the cost table of every
stage (:mod:`agentrl.report.cost`).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from agentrl.config import ConfigError, add_config_arguments, config_from_args
from agentrl.errors import DataFormatError, UserInputError, read_json_file
from agentrl.model.folder import MODEL_SOURCE_KEY
from agentrl.paths import check_writable
from agentrl.report.plots import (
    plot_accuracy_by_stage,
    plot_reasoning_modes,
    plot_training_curves,
    read_training_log,
)
from agentrl.report.tables import (
    PUBLISHED_PATH,
    read_eval_results,
    read_filter_stats,
    read_published,
    summary_frame,
    summary_markdown,
)
from agentrl.stage_cli import setup_logging, stage_parser

log = logging.getLogger("agentrl.report")


def _relative(path: Path, start: Path) -> str:
    """A link that works from summary.md wherever the results folder is moved."""
    return os.path.relpath(path.resolve(), start.resolve())


def published_for(pairs: list[str], published_path: Path, models: set[str]) -> dict:
    """``MODEL=NAME`` pairs -> {model: the published entry NAME}, each side checked."""
    entries = read_published(published_path)
    chosen = {}
    for pair in pairs:
        model, sep, name = pair.partition("=")
        if not sep or not model or not name:
            raise UserInputError(f"--published-model {pair!r}: expected MODEL=NAME")
        if model not in models:
            raise UserInputError(f"--published-model {pair!r}: no metrics of {model!r} (have {sorted(models)})")
        if name not in entries:
            raise UserInputError(
                f"--published-model {pair!r}: {published_path} has no entry {name!r} (has {sorted(entries)})"
            )
        chosen[model] = entries[name]
    return chosen


def model_sources(pairs: list[str]) -> dict[str, dict]:
    """``MODEL=CONFIG_JSON`` pairs -> {model: its recorded source} for the models linked or
    downloaded (``agentrl_source`` in config.json, :func:`agentrl.model.folder.resolve_pretrained`)."""
    sources = {}
    for pair in pairs:
        model, sep, path = pair.partition("=")
        if not sep or not model or not path:
            raise UserInputError(f"--model-config {pair!r}: expected MODEL=PATH")
        source = read_json_file(Path(path)).get(MODEL_SOURCE_KEY)
        if source is not None:
            sources[model] = source
    return sources


def _read_inputs(args: argparse.Namespace) -> tuple[list, dict, dict, dict | None]:
    """Every input read and checked before any output is written (a report that stopped half way
    would leave plots beside no summary): the evaluations, the published entries, the models'
    sources, the training logs and the filter stats. A broken one raises DataFormatError naming it."""
    results = read_eval_results(args.metrics)
    published = published_for(args.published_model, args.published, {r.model for r in results})
    sources = model_sources(args.model_config)
    for stage, log_path, plot_path in (("sft", args.sft_metrics, args.sft_plot), ("rl", args.rl_metrics, args.rl_plot)):
        if (log_path is None) != (plot_path is None):
            raise UserInputError(f"give both --{stage}-metrics and --{stage}-plot, or neither")
        if log_path is not None:
            rows = read_training_log(log_path)[1]
            if stage == "rl" and args.health_plot is not None and not any("tool_health/calls" in r for r in rows):
                raise DataFormatError(
                    f"{log_path}: no tool_health/ keys to plot (a log written before GRPO logged tool health); "
                    "leave out --health-plot or train again"
                )
    if args.health_md is not None and (args.health_csv is None or (args.health_plot and args.rl_metrics is None)):
        raise UserInputError("--health-md needs --health-csv, and --health-plot needs --rl-metrics")
    filter_stats = read_filter_stats(args.filter_stats) if args.filter_stats is not None else None
    if args.cost_md is not None and not args.cost_md.is_file():  # linked from the summary: it must be there
        raise DataFormatError(f"--cost-md {args.cost_md}: no such file; write it first (agentrl report cost --md)")
    return results, published, sources, filter_stats


def build_report(args: argparse.Namespace) -> None:
    results, published, sources, filter_stats = _read_inputs(args)
    frame = summary_frame(results, published)
    out_dir = args.table_md.parent
    plots: list[tuple[str, str]] = []
    plot_accuracy_by_stage(results, args.accuracy_plot, published)
    plots.append(("accuracy by model stage", _relative(args.accuracy_plot, out_dir)))
    plot_reasoning_modes(results, args.modes_plot)
    plots.append(("reasoning modes", _relative(args.modes_plot, out_dir)))
    for stage, log_path, plot_path in (("SFT", args.sft_metrics, args.sft_plot), ("RL", args.rl_metrics, args.rl_plot)):
        if log_path is not None:
            drawn = plot_training_curves(log_path, plot_path, stage)
            log.info("%s curves: %s", stage, ", ".join(drawn))
            plots.append((f"{stage} training curves", _relative(plot_path, out_dir)))
    if args.pass_rate_histogram is not None:
        plots.append(("RL pool pass rates", _relative(args.pass_rate_histogram, out_dir)))
    tables: list[tuple[str, str]] = []
    if args.health_md is not None:
        write_health(args, results)
        tables.append(
            ("tool health: what each tool call came to, per stage and benchmark", _relative(args.health_md, out_dir))
        )
    if args.cost_md is not None:
        tables.append(("cost: time, tokens and MFU of every stage", _relative(args.cost_md, out_dir)))
    args.table_md.parent.mkdir(parents=True, exist_ok=True)
    summary = summary_markdown(frame, filter_stats, plots, published, sources, tables, args.note)
    args.table_md.write_text(summary, encoding="utf-8")
    args.table_csv.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.table_csv, index=False)


def write_health(args: argparse.Namespace, results) -> None:
    """health.md and health.csv (:mod:`agentrl.report.health`), with GRPO's plot when its log is given."""
    from agentrl.report.health import health_frame, health_markdown, plot_grpo_health
    from agentrl.report.plots import read_training_log

    rl_rows = read_training_log(args.rl_metrics)[1] if args.rl_metrics is not None else None
    frame = health_frame(results, rl_rows)
    plot = None
    if args.health_plot is not None:
        plot_grpo_health(rl_rows, args.health_plot)
        plot = _relative(args.health_plot, args.health_md.parent)
    args.health_md.parent.mkdir(parents=True, exist_ok=True)
    args.health_md.write_text(health_markdown(frame, plot), encoding="utf-8")
    frame.to_csv(args.health_csv, index=False)


def ablations_main(argv: list[str]) -> int:
    """``python -m agentrl report ablations``: the ablation tables and plots (:mod:`agentrl.report.ablations`)."""
    from agentrl.report import ablations  # lazy: the main report does not need it

    parser = stage_parser("report ablations", ablations.__doc__)
    add_config_arguments(parser)
    parser.add_argument(
        "--training",
        type=Path,
        nargs="+",
        required=True,
        help="GRPO logs, laid out as .../<arm>/seed<k>/rl/metrics.jsonl",
    )
    parser.add_argument(
        "--eval-metrics",
        type=Path,
        nargs="+",
        required=True,
        help="evaluations, laid out as .../<arm>/seed<k>/eval/<benchmark>/metrics.json",
    )
    parser.add_argument(
        "--samples",
        type=Path,
        nargs="+",
        required=True,
        help="their samples, .../<arm>/seed<k>/eval/<benchmark>/samples.jsonl",
    )
    parser.add_argument(
        "--out-dir", type=Path, required=True, help="output folder: {data,algorithm,reasoning}.{md,csv,png}"
    )
    args = parser.parse_args(argv)
    setup_logging()
    try:
        cfg = config_from_args(args).ablations
        ablations.check_ablations(cfg)
    except ConfigError as exc:
        parser.error(str(exc))
    runs = ablations.load_runs(args.training, args.eval_metrics, args.samples)
    written = ablations.write_ablations(cfg, runs, args.out_dir)
    ablations.log.info("wrote %s", ", ".join(map(str, written)))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["ablations"]:
        return ablations_main(argv[1:])
    if argv[:1] == ["cost"]:
        from agentrl.report import cost

        return cost.main(argv[1:])
    parser = stage_parser("report", __doc__)
    parser.add_argument(
        "--metrics",
        type=Path,
        nargs="+",
        required=True,
        help="eval metrics.json files, laid out as .../<model>/<benchmark>/metrics.json",
    )
    parser.add_argument("--sft-metrics", type=Path, help="SFT training log (metrics.jsonl)")
    parser.add_argument("--rl-metrics", type=Path, help="RL training log (metrics.jsonl)")
    parser.add_argument("--filter-stats", type=Path, help="the filter stage's stats.json")
    parser.add_argument(
        "--pass-rate-histogram", type=Path, help="the filter stage's histogram PNG (linked from the summary)"
    )
    parser.add_argument(
        "--published", type=Path, default=PUBLISHED_PATH, help="published figures (YAML; default: %(default)s)"
    )
    parser.add_argument(
        "--model-config",
        action="append",
        default=[],
        metavar="MODEL=PATH",
        help="an evaluated model's config.json: a recorded source (hub id, revision, commit) is listed",
    )
    parser.add_argument(
        "--published-model",
        action="append",
        default=[],
        metavar="MODEL=NAME",
        help="compare evaluated MODEL with the published entry NAME (repeatable; config eval.published)",
    )
    parser.add_argument(
        "--note",
        help="a line put at the top of summary.md (config report.note: the smoke preset's says its numbers mean nothing)",
    )
    parser.add_argument("--table-md", type=Path, required=True, help="output: summary.md")
    parser.add_argument("--table-csv", type=Path, required=True, help="output: summary.csv")
    parser.add_argument("--accuracy-plot", type=Path, required=True, help="output: accuracy by model stage (PNG)")
    parser.add_argument("--modes-plot", type=Path, required=True, help="output: reasoning modes (PNG)")
    parser.add_argument("--sft-plot", type=Path, help="output: SFT training curves (PNG), with --sft-metrics")
    parser.add_argument("--rl-plot", type=Path, help="output: RL training curves (PNG), with --rl-metrics")
    parser.add_argument("--health-md", type=Path, help="output: the tool-health table (health.md), with --health-csv")
    parser.add_argument("--health-csv", type=Path, help="output: the tool-health table as CSV")
    parser.add_argument("--health-plot", type=Path, help="output: GRPO's tool health over the steps (PNG)")
    parser.add_argument("--cost-md", type=Path, help="the cost table (`report cost`'s --md, written first), linked")
    args = parser.parse_args(argv)
    setup_logging()
    check_writable(
        (args.table_md, "--table-md"),
        (args.table_csv, "--table-csv"),
        (args.accuracy_plot, "--accuracy-plot"),
        (args.modes_plot, "--modes-plot"),
        (args.sft_plot, "--sft-plot"),
        (args.rl_plot, "--rl-plot"),
        (args.health_md, "--health-md"),
        (args.health_csv, "--health-csv"),
        (args.health_plot, "--health-plot"),
    )
    build_report(args)
    log.info("wrote %s and %s", args.table_md, args.table_csv)
    return 0
