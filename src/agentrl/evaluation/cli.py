"""``python -m agentrl evaluate run|export-livecodebench``: benchmark evaluation of one model.

- ``run``: ``eval.n`` agentic samples per problem of one benchmark, with ``eval.temperature`` /
  ``eval.top_p`` (paper: 32 / 1.0 / 0.6), the RL rollout engine and agent loop, graded by the
  reward registry -> ``samples.jsonl`` (one row per sample, :mod:`agentrl.evaluation.samples`)
  and ``metrics.json`` (:func:`agentrl.evaluation.metrics.summarize_benchmark` of those rows,
  plus a ``run`` block saying what was evaluated and how).
- ``export-livecodebench``: the samples of a code benchmark in the input format of
  LiveCodeBench's official evaluator (:mod:`agentrl.evaluation.livecodebench`).

Every model is sampled with the same seed per benchmark (common random numbers), so the
difference between two model stages is not blurred by different sampling noise where their
distributions agree.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from agentrl.cli_help import HelpFormatter
from agentrl.config import Config, add_config_arguments, config_from_args
from agentrl.data.records import read_problems
from agentrl.evaluation.livecodebench import custom_outputs, write_custom_outputs
from agentrl.evaluation.metrics import summarize_benchmark
from agentrl.evaluation.samples import read_jsonl, write_jsonl
from agentrl.model.folder import check_model_folder
from agentrl.paths import check_writable
from agentrl.stage_cli import setup_logging, stage_parser
from agentrl.tracking import Tracker, check_tracking

log = logging.getLogger("agentrl.evaluate")


def metrics_of_samples(samples_path: Path, run: dict[str, Any]) -> dict[str, Any]:
    """metrics.json: the summary of the samples file plus the ``run`` block."""
    rows = list(read_jsonl(samples_path))
    summary = summarize_benchmark(rows, source=str(samples_path))
    scores = [float(r["score"]) for r in rows]
    finish: dict[str, int] = {}
    for row in rows:
        finish[row["finish_reason"]] = finish.get(row["finish_reason"], 0) + 1
    return {**summary, "mean_score": sum(scores) / len(scores), "finish_reasons": finish, "run": run}


def run(
    cfg: Config,
    model_dir: Path,
    problems_path: Path,
    samples_out: Path,
    metrics_out: Path,
    benchmark: str,
    max_problems: int | None = None,
) -> dict:
    from agentrl.evaluation.sampling import SamplingSetup, graded_sample_rows

    check_tracking(cfg.tracking)  # a missing package stops the job before any sampling
    problems = read_problems(problems_path)[:max_problems]  # None: all
    e = cfg.eval
    # Evaluation has its own prompt limit (upstream's eval scripts: 4096); fit_prompts kept only
    # problems within it, and the engine's context is sized by it.
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_prompt_tokens=e.max_prompt_tokens))
    setup = SamplingSetup(
        n=e.n, temperature=e.temperature, top_p=e.top_p, seed=cfg.seed, seed_tag=f"evaluate.{benchmark}"
    )
    log.info(
        "evaluating %s on %s (%d problems): n=%d, temperature=%g, top_p=%g",
        model_dir,
        benchmark,
        len(problems),
        e.n,
        e.temperature,
        e.top_p,
    )
    count = write_jsonl(graded_sample_rows(cfg, str(model_dir), problems, setup), samples_out)
    assert count == len(problems) * e.n, f"wrote {count} samples for {len(problems)} problems x n={e.n}"
    run_info = {
        "model": str(model_dir),
        "benchmark": benchmark,
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
    try:
        metrics = metrics_of_samples(samples_out, run_info)
        metrics_out.parent.mkdir(parents=True, exist_ok=True)
        metrics_out.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    except BaseException:
        samples_out.unlink(missing_ok=True)  # no samples file without its metrics: the stage failed
        raise
    tracker = Tracker(cfg.tracking, metrics_out.parent, f"eval/{model_dir.name}/{benchmark}", True, run_info)
    tracker.log({f"eval/{benchmark}/{key}": value for key, value in metrics.items()}, step=0)
    tracker.close()
    return metrics


def main(argv: list[str]) -> int:
    parser = stage_parser("evaluate", __doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    p_run = commands.add_parser(
        "run",
        help="sample, grade and summarize one model on one benchmark",
        formatter_class=HelpFormatter,
    )
    add_config_arguments(p_run)
    p_run.add_argument("--model", type=Path, required=True, help="Hugging Face model folder")
    p_run.add_argument(
        "--problems", type=Path, required=True, help="normalized eval parquet (results/data/eval/<name>.parquet)"
    )
    p_run.add_argument("--benchmark", help="benchmark name for logs and the seed (default: the parquet's stem)")
    p_run.add_argument("--samples", type=Path, required=True, help="output: samples.jsonl")
    p_run.add_argument("--metrics", type=Path, required=True, help="output: metrics.json")
    p_run.add_argument("--threads", type=int, help="CPU threads for torch (the rule's threads)")
    p_run.add_argument(
        "--max-problems", type=int, help="evaluate only the first N problems (a smaller budget, e.g. the ablations')"
    )
    p_lcb = commands.add_parser(
        "export-livecodebench",
        help="code samples -> LiveCodeBench custom-evaluator JSON",
        formatter_class=HelpFormatter,
    )
    p_lcb.add_argument("--problems", type=Path, required=True, help="normalized eval parquet of a code benchmark")
    p_lcb.add_argument("--samples", type=Path, required=True, help="samples.jsonl written by `evaluate run`")
    p_lcb.add_argument("--out", type=Path, required=True, help="output: the custom_output_file JSON")
    args = parser.parse_args(argv)
    setup_logging()
    if args.command == "run":
        check_writable((args.samples, "--samples"), (args.metrics, "--metrics"))
        check_model_folder(args.model, "--model")
        from agentrl.training.threads import set_torch_threads

        set_torch_threads(args.threads)
        benchmark = args.benchmark or args.problems.stem
        metrics = run(
            config_from_args(args), args.model, args.problems, args.samples, args.metrics, benchmark, args.max_problems
        )
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
    else:
        check_writable((args.out, "--out"))
        outputs = custom_outputs(read_problems(args.problems), read_jsonl(args.samples), str(args.samples))
        write_custom_outputs(outputs, args.out)
        log.info("wrote %d questions x %d samples to %s", len(outputs), len(outputs[0]["code_list"]), args.out)
    return 0
