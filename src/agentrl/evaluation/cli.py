"""``python -m agentrl evaluate run|shard|gather|export-livecodebench``: benchmark evaluation of one model.

- ``run``: ``eval.n`` samples per problem of one benchmark (or of several, one after another
  in one process: ``--problems``, ``--samples`` and ``--metrics`` take one path per benchmark,
  in the same order), with ``eval.temperature`` /
  ``eval.top_p`` (paper: 32 / 1.0 / 0.6), the RL rollout engine and agent loop, graded by the
  reward registry -> ``samples.jsonl`` (one row per sample, :mod:`agentrl.sampling.samples`)
  and ``metrics.json`` (:func:`agentrl.sampling.metrics.summarize_benchmark` of those rows,
  plus a ``run`` block saying what was evaluated and how).
- ``--reasoning`` (every command but the export): ``agentic`` (default: the code tool, as the
  recipe trains) or ``self_contained`` (the model card's no-tool half: no tool schema, the
  prompts' tool sentences replaced, one turn, no tool ever run; ``eval.reasoning`` lists the
  halves the workflow evaluates). The ``run`` block records it, and the report reads it from there.
- ``shard`` and ``gather``: the same split into ``eval.shards`` jobs (the workflow's way): each
  shard samples a range of the problems into a resumable shard file
  (:mod:`agentrl.sampling.shards`); the gather writes ``samples.jsonl`` in problem order and
  then the metrics, so they are the same for any shard count.
- ``export-livecodebench``: the samples of a code benchmark in the input format of
  LiveCodeBench's official evaluator (:mod:`agentrl.evaluation.livecodebench`).

Every model is sampled with the same seed per benchmark (common random numbers), so the
difference between two model stages is not blurred by different sampling noise where their
distributions agree.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from agentrl.config import Config, config_from_args
from agentrl.cpus import set_torch_threads
from agentrl.data.records import write_records
from agentrl.evaluation.livecodebench import custom_outputs, write_custom_outputs
from agentrl.model.folder import check_model_folder
from agentrl.paths import check_writable
from agentrl.rewards.ground_truth import read_gradable_problems
from agentrl.sampling.metrics import summarize_benchmark
from agentrl.sampling.rollouts import PROBLEMS_IN_FLIGHT, SamplingSetup
from agentrl.sampling.samples import read_jsonl, write_jsonl
from agentrl.sampling.shards import add_shard_arguments, gathered_rows, run_shard
from agentrl.stage_cli import add_command, at_least, setup_logging, stage_parser
from agentrl.tools.health import log_tool_health
from agentrl.tracking import Tracker, check_tracking

log = logging.getLogger("agentrl.evaluate")


def metrics_of_samples(samples_path: Path, run: dict[str, Any]) -> dict[str, Any]:
    """metrics.json: the summary of the samples file, its ``tool_health``, and the ``run`` block.

    A problem with a sample left out for an infrastructure failure (``infra_failed``,
    :mod:`agentrl.tools.health`) is left out of the summary whole, with its other samples: the
    "@n" metrics need n samples of every problem. ``tool_health`` counts all rows, and
    ``tool_health.problems_left_out`` those problems.
    """
    rows = list(read_jsonl(samples_path))
    lost = {row["problem_id"] for row in rows if row.get("infra_failed", False)}
    kept = [row for row in rows if row["problem_id"] not in lost]
    if not kept:
        raise RuntimeError(
            f"{samples_path}: every problem has a sample whose tool call the sandbox lost twice; "
            "nothing is left to summarize (see the shard logs for what failed)"
        )
    summary = summarize_benchmark(kept, source=str(samples_path))
    scores = [float(r["score"]) for r in kept]
    finish: dict[str, int] = {}
    for row in kept:
        finish[row["finish_reason"]] = finish.get(row["finish_reason"], 0) + 1
    health = {**log_tool_health(rows, f"evaluation of {samples_path}"), "problems_left_out": len(lost)}
    return {
        **summary,
        "mean_score": sum(scores) / len(scores),
        "finish_reasons": finish,
        "tool_health": health,
        "run": run,
    }


REASONING = ("agentic", "self_contained")


def eval_setup(
    cfg: Config, benchmark: str, problems_per_chunk: int = PROBLEMS_IN_FLIGHT, reasoning: str = "agentic"
) -> SamplingSetup:
    """Both halves draw from the benchmark's seed: common random numbers, as between models."""
    e = cfg.eval
    tag = f"evaluate.{benchmark}"
    return SamplingSetup(e.n, e.temperature, e.top_p, cfg.seed, tag, problems_per_chunk, reasoning)


def eval_rollout_config(cfg: Config) -> Config:
    """Evaluation has its own prompt limit (upstream's eval scripts: 4096); fit_prompts kept only
    problems within it, and the engine's context is sized by it."""
    rollout = dataclasses.replace(cfg.rollout, max_prompt_tokens=cfg.eval.max_prompt_tokens)
    return dataclasses.replace(cfg, rollout=rollout)


def eval_config(cfg: Config, reasoning: str = "agentic") -> dict:
    """What the evaluation rollouts read, for the shard files' fingerprint. The agentic half's
    has no reasoning key, so that its shard files resume whatever wrote them."""
    sections = {key: dataclasses.asdict(getattr(cfg, key)) for key in ("rollout", "reward", "sandbox", "tool")}
    e = cfg.eval
    sampling = {"n": e.n, "temperature": e.temperature, "top_p": e.top_p}
    if reasoning != "agentic":
        sampling["reasoning"] = reasoning
    return {"seed": cfg.seed, **sections, "eval": sampling}


def run_info(
    cfg: Config,
    model_dir: Path,
    problems_path: Path,
    benchmark: str,
    max_problems: int | None,
    reasoning: str = "agentic",
) -> dict:
    """metrics.json's ``run`` block: what was evaluated and how."""
    e = cfg.eval
    return {
        "model": str(model_dir),
        "benchmark": benchmark,
        "reasoning": reasoning,
        "problems": str(problems_path),
        "n": e.n,
        "temperature": e.temperature,
        "top_p": e.top_p,
        "top_k": cfg.rollout.top_k,
        "max_turns": cfg.rollout.max_turns,
        "max_response_tokens": cfg.rollout.max_response_tokens,
        "max_prompt_tokens": e.max_prompt_tokens,
        "grading": {key: getattr(cfg.reward, key) for key in ("math_mode", "choice_mode", "unknown_source")},
        "engine": cfg.rollout.engine,
        "seed": cfg.seed,
        "max_problems": max_problems,
    }


def run_shard_of(
    cfg: Config,
    model_dir: Path,
    problems_path: Path,
    benchmark: str,
    shard: int,
    shards: int,
    out: Path,
    problems_per_chunk: int = PROBLEMS_IN_FLIGHT,
    reasoning: str = "agentic",
) -> None:
    """Shard ``shard`` of ``shards`` of a benchmark's problems -> its resumable shard file."""
    # The gather job tracks the metrics; a missing package stops the shards before any sampling,
    # not the gather after all of it.
    check_tracking(cfg.tracking)
    e = cfg.eval
    cfg = eval_rollout_config(cfg)
    log.info(
        "evaluating %s on %s (%s): n=%d, temperature=%g, top_p=%g",
        model_dir,
        benchmark,
        reasoning,
        e.n,
        e.temperature,
        e.top_p,
    )
    setup = eval_setup(cfg, benchmark, problems_per_chunk, reasoning)
    run_shard(cfg, model_dir, problems_path, setup, eval_config(cfg, reasoning), shard, shards, out)


def gather(
    cfg: Config,
    model_dir: Path,
    problems_path: Path,
    benchmark: str,
    shard_paths: list[Path],
    samples_out: Path,
    metrics_out: Path,
    max_problems: int | None = None,
    reasoning: str = "agentic",
) -> dict:
    """Shard files -> ``samples.jsonl`` in problem order, then ``metrics.json`` of all of it."""
    check_tracking(cfg.tracking)  # a missing package stops the job before any work
    problems = read_gradable_problems(problems_path)[:max_problems]
    count = write_jsonl(gathered_rows(problems, shard_paths, cfg.eval.n), samples_out)
    assert count == len(problems) * cfg.eval.n, f"wrote {count} samples for {len(problems)} problems x n={cfg.eval.n}"
    info = run_info(cfg, model_dir, problems_path, benchmark, max_problems, reasoning)
    try:
        metrics = metrics_of_samples(samples_out, info)
        metrics_out.parent.mkdir(parents=True, exist_ok=True)
        metrics_out.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    except BaseException:
        samples_out.unlink(missing_ok=True)  # no samples file without its metrics: the stage failed
        raise
    half = "" if reasoning == "agentic" else f"{reasoning}/"
    tracker = Tracker(cfg.tracking, metrics_out.parent, f"eval/{model_dir.name}/{half}{benchmark}", True, info)
    tracker.log({f"eval/{benchmark}/{key}": value for key, value in metrics.items()}, step=0)
    tracker.close()
    return metrics


def run(
    cfg: Config,
    model_dir: Path,
    problems_path: Path,
    samples_out: Path,
    metrics_out: Path,
    benchmark: str,
    max_problems: int | None = None,
    reasoning: str = "agentic",
) -> dict:
    """One job for the whole benchmark: one shard (beside the samples), then the gather."""
    check_tracking(cfg.tracking)  # a missing package stops the job before any sampling
    problems_in = problems_path
    if max_problems is not None:  # the first N problems as a problem file of their own
        problems_in = samples_out.with_name(samples_out.stem + ".problems.parquet")
        write_records(read_gradable_problems(problems_path)[:max_problems], problems_in)
    shard_file = samples_out.with_name(samples_out.stem + ".shard.jsonl")
    run_shard_of(cfg, model_dir, problems_in, benchmark, 0, 1, shard_file, reasoning=reasoning)
    metrics = gather(
        cfg, model_dir, problems_path, benchmark, [shard_file], samples_out, metrics_out, max_problems, reasoning
    )
    shard_file.unlink()
    if problems_in != problems_path:
        problems_in.unlink()
    return metrics


def _parser() -> argparse.ArgumentParser:
    parser = stage_parser("evaluate", __doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    p_run = add_command(commands, "run", "sample, grade and summarize one model on one benchmark or several")
    p_run.add_argument("--model", type=Path, required=True, help="Hugging Face model folder")
    p_run.add_argument(
        "--problems",
        type=Path,
        nargs="+",
        required=True,
        help="normalized eval parquet(s) (results/data/eval/<name>.parquet), one per benchmark",
    )
    p_run.add_argument(
        "--benchmark",
        nargs="+",
        help="benchmark name(s) for logs and the seed, one per --problems (default: each parquet's stem)",
    )
    p_run.add_argument(
        "--samples", type=Path, nargs="+", required=True, help="output(s): samples.jsonl, one per --problems"
    )
    p_run.add_argument(
        "--metrics", type=Path, nargs="+", required=True, help="output(s): metrics.json, one per --problems"
    )
    p_run.add_argument("--threads", type=int, help="CPU threads for torch (the rule's threads)")
    p_run.add_argument(
        "--max-problems",
        type=at_least(1),
        help="evaluate only the first N problems (a smaller budget, e.g. the ablations')",
    )
    p_shard = add_command(commands, "shard", "one shard of a benchmark's problems -> its shard file (resumable)")
    p_shard.add_argument("--model", type=Path, required=True, help="Hugging Face model folder")
    p_shard.add_argument("--problems", type=Path, required=True, help="normalized eval parquet")
    p_shard.add_argument("--benchmark", required=True, help="benchmark name (logs and the seed)")
    add_shard_arguments(p_shard, "eval.shards")
    p_gather = add_command(commands, "gather", "shard files -> samples.jsonl and metrics.json")
    p_gather.add_argument("--model", type=Path, required=True, help="the model folder (for the run block)")
    p_gather.add_argument("--problems", type=Path, required=True, help="normalized eval parquet")
    p_gather.add_argument("--benchmark", required=True, help="benchmark name")
    p_gather.add_argument("--shard-files", type=Path, nargs="+", required=True, help="every shard file")
    p_gather.add_argument("--samples", type=Path, required=True, help="output: samples.jsonl")
    p_gather.add_argument("--metrics", type=Path, required=True, help="output: metrics.json")
    for command in (p_run, p_shard, p_gather):
        command.add_argument(
            "--reasoning",
            choices=REASONING,
            default="agentic",
            help="agentic (the code tool) or self_contained (no tool schema, no tool turns); default: %(default)s",
        )
    p_lcb = add_command(
        commands, "export-livecodebench", "code samples -> LiveCodeBench custom-evaluator JSON", config=False
    )
    p_lcb.add_argument("--problems", type=Path, required=True, help="normalized eval parquet of a code benchmark")
    p_lcb.add_argument("--samples", type=Path, required=True, help="samples.jsonl written by `evaluate run`")
    p_lcb.add_argument("--out", type=Path, required=True, help="output: the custom_output_file JSON")
    return parser


def _shard_command(args: argparse.Namespace) -> None:
    check_writable((args.out, "--out", "file"))
    check_model_folder(args.model, "--model")
    set_torch_threads(args.threads)
    cfg = config_from_args(args)
    run_shard_of(
        cfg,
        args.model,
        args.problems,
        args.benchmark,
        args.shard,
        args.shards,
        args.out,
        args.problems_per_chunk,
        args.reasoning,
    )


def run_jobs(args: argparse.Namespace) -> list[tuple[Path, str, Path, Path]]:
    """``run``'s (problems, benchmark, samples, metrics) per benchmark, from its parallel lists."""
    benchmarks = args.benchmark or [path.stem for path in args.problems]
    counts = {
        "--problems": len(args.problems),
        "--benchmark": len(benchmarks),
        "--samples": len(args.samples),
        "--metrics": len(args.metrics),
    }
    if len(set(counts.values())) != 1:
        given = ", ".join(f"{flag} {count}" for flag, count in counts.items())
        raise SystemExit(f"evaluate run: one path (and name) per benchmark in each list, in one order; got {given}")
    outputs = [*args.samples, *args.metrics]
    if len(set(outputs)) != len(outputs):
        raise SystemExit("evaluate run: --samples and --metrics name the same file twice")
    return list(zip(args.problems, benchmarks, args.samples, args.metrics, strict=True))


def _run_command(args: argparse.Namespace) -> None:
    """Every benchmark in turn, in one process: one start-up (interpreter, torch, config) for all."""
    jobs = run_jobs(args)
    for _, _, samples, metrics in jobs:
        check_writable((samples, "--samples", "file"), (metrics, "--metrics", "file"))
    cfg = config_from_args(args)
    check_model_folder(args.model, "--model")
    set_torch_threads(args.threads)
    for problems, benchmark, samples, metrics_out in jobs:
        metrics = run(cfg, args.model, problems, samples, metrics_out, benchmark, args.max_problems, args.reasoning)
        _log_headline(benchmark, metrics)


def _gather_command(args: argparse.Namespace) -> None:
    check_writable((args.samples, "--samples", "file"), (args.metrics, "--metrics", "file"))
    cfg = config_from_args(args)
    benchmark = args.benchmark
    metrics = gather(
        cfg,
        args.model,
        args.problems,
        benchmark,
        args.shard_files,
        args.samples,
        args.metrics,
        reasoning=args.reasoning,
    )
    _log_headline(benchmark, metrics)


def _log_headline(benchmark: str, metrics: dict) -> None:
    n = metrics["samples_per_problem"]
    log.info(
        "%s: avg@%d %.3f, pass@%d %.3f, tool calls/response %.2f",
        benchmark,
        n,
        metrics[f"avg@{n}"],
        n,
        metrics["pass@k"][str(n)],
        metrics["tool_use"]["tool_calls_per_response"],
    )


def _export_livecodebench_command(args: argparse.Namespace) -> None:
    check_writable((args.out, "--out"))
    outputs = custom_outputs(read_gradable_problems(args.problems), read_jsonl(args.samples), str(args.samples))
    write_custom_outputs(outputs, args.out)
    log.info("wrote %d questions x %d samples to %s", len(outputs), len(outputs[0]["code_list"]), args.out)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    setup_logging()
    if args.command == "shard":
        _shard_command(args)
    elif args.command == "run":
        _run_command(args)
    elif args.command == "gather":
        _gather_command(args)
    else:
        _export_livecodebench_command(args)
    return 0
