"""``python -m agentrl filter score|score-shard|gather|scoring-config|select``: model-aware RL data filtering (docs/recipe.md section 6).

- ``score``: the SFT model makes ``filter.k`` agentic rollouts of every RL-pool problem (the RL
  rollout engine and reward registry) -> the pass-rate table and the graded samples.
- ``score-shard`` and ``gather``: the same split into ``filter.shards`` jobs (the workflow's way):
  each shard writes its range of the pool to a resumable shard file
  (:mod:`agentrl.sampling.shards`), and the gather writes the table and samples from them,
  byte for byte what ``score`` writes, for any shard count.
- ``scoring-config``: what the pass rates are computed from (the scoring config and the
  checksums of the SFT model's config.json and the pool), the file the workflow's selection
  depends on instead of the pass rates themselves (rules/filter.smk says why).
- ``select``: the band and the optional histogram matching (:mod:`agentrl.filtering.selection`)
  -> the RL training set (normalized Problems), the counts that explain it, and a histogram.

The two are separate stages so that changing a threshold re-runs only the cheap selection.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from agentrl.config import Config, config_from_args
from agentrl.data.records import Problem, write_records
from agentrl.errors import DataFormatError
from agentrl.filtering.histogram import plot_pass_rate_histogram
from agentrl.filtering.pass_rates import pass_rate_table, read_pass_rates, write_pass_rates
from agentrl.filtering.selection import select_problems, target_shares_from_table
from agentrl.model.folder import check_model_folder
from agentrl.paths import check_writable
from agentrl.rewards.ground_truth import read_gradable_problems
from agentrl.sampling.rollouts import PROBLEMS_IN_FLIGHT, SamplingSetup
from agentrl.sampling.samples import write_jsonl
from agentrl.sampling.shards import add_shard_arguments, gathered_rows, run_shard
from agentrl.stage_cli import add_command, setup_logging, stage_parser
from agentrl.tools.health import log_tool_health
from agentrl.training.fingerprint import file_sha256

log = logging.getLogger("agentrl.filter")


SEED_TAG = "filter.score"


def scoring_setup(cfg: Config, problems_per_chunk: int = PROBLEMS_IN_FLIGHT) -> SamplingSetup:
    f = cfg.filter
    return SamplingSetup(f.k, f.temperature, f.top_p, cfg.seed, SEED_TAG, problems_per_chunk)


def scoring_config(cfg: Config) -> dict:
    """What the scoring rollouts read, for the shard files' fingerprint."""
    sections = {key: dataclasses.asdict(getattr(cfg, key)) for key in ("rollout", "reward", "sandbox", "tool")}
    return {
        "seed": cfg.seed,
        **sections,
        "filter": {"k": cfg.filter.k, "temperature": cfg.filter.temperature, "top_p": cfg.filter.top_p},
    }


def score_shard(
    cfg: Config,
    model_dir: Path,
    pool_path: Path,
    shard: int,
    shards: int,
    out: Path,
    problems_per_chunk: int = PROBLEMS_IN_FLIGHT,
) -> None:
    """Shard ``shard`` of ``shards`` of the pool: k graded rollouts per problem -> the shard file."""
    f = cfg.filter
    log.info("scoring %s with %s: k=%d, temperature=%g, top_p=%g", pool_path, model_dir, f.k, f.temperature, f.top_p)
    started = time.perf_counter()
    setup = scoring_setup(cfg, problems_per_chunk)
    run_shard(cfg, model_dir, pool_path, setup, scoring_config(cfg), shard, shards, out)
    log.info("shard %d of %d written to %s in %.1f s", shard + 1, shards, out, time.perf_counter() - started)


def gather(k: int, pool_path: Path, shard_paths: list[Path], pass_rates_out: Path, samples_out: Path) -> None:
    """The shard files, in pool order -> ``samples.jsonl`` and the pass-rate table (the same for any shard count)."""
    problems = read_gradable_problems(pool_path)
    rows = []
    counted = ("problem_id", "acc", "score", "tool_calls", "response_length", "tool_outcomes", "attempts")

    def keep(stream):
        # The samples file gets each row as it comes; the table keeps only the counts it needs
        # (texts of 240K paper-scale rollouts would not fit in memory).
        for row in stream:
            rows.append({key: row[key] for key in counted if key in row} | {"infra_failed": row.get("infra_failed")})
            yield row

    write_jsonl(keep(gathered_rows(problems, shard_paths, k)), samples_out)
    table = pass_rate_table(problems, rows, k)
    write_pass_rates(table, pass_rates_out)
    log_tool_health(rows, "scoring")
    log.info(
        "gathered %d shard files: mean pass rate %.3f; solved never %d, always %d, of %d",
        len(shard_paths),
        table["pass_rate"].mean(),
        int((table["pass_rate"] == 0).sum()),
        int((table["pass_rate"] == 1).sum()),
        len(table),
    )


def score(cfg: Config, model_dir: Path, pool_path: Path, pass_rates_out: Path, samples_out: Path) -> None:
    """The whole pool in one process: one shard, then the gather (the shard file lands beside the samples)."""
    shard_file = samples_out.with_name(samples_out.stem + ".shard.jsonl")
    score_shard(cfg, model_dir, pool_path, 0, 1, shard_file)
    gather(cfg.filter.k, pool_path, [shard_file], pass_rates_out, samples_out)
    shard_file.unlink()


def write_scoring_record(cfg: Config, model_config: Path, pool_path: Path, out: Path) -> None:
    """``scoring_config(cfg)`` and the SHA-256 of the SFT model's config.json (it changes with the
    weights, agentrl.model.folder) and of the pool, as JSON: equal files mean equal pass rates."""
    record = {
        "scoring": scoring_config(cfg),
        "model_config_sha256": file_sha256(model_config),
        "pool_sha256": file_sha256(pool_path),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _rl_problem(problem: Problem, pass_rate: float, bucket: str) -> Problem:
    """The pool problem, with its SFT pass rate and bucket in ``extra`` for the RL stage's logs."""
    extra = {**problem.extra, "filter_pass_rate": pass_rate, "filter_bucket": bucket}
    return Problem(problem.id, problem.data_source, problem.prompt, problem.ability, problem.ground_truth, extra)


def select(
    cfg: Config, pass_rates_path: Path, pool_path: Path, out: Path, stats_out: Path, histogram_out: Path
) -> dict:
    table = read_pass_rates(pass_rates_path)
    f = cfg.filter
    shares = f.target_histogram
    if f.target_pass_rates is not None:
        shares = target_shares_from_table(read_pass_rates(f.target_pass_rates), f, f.target_pass_rates)
    selection = select_problems(table, f, cfg.seed, shares, origin=str(pass_rates_path))
    pool = {p.id: p for p in read_gradable_problems(pool_path)}
    missing = [i for i in selection.ids if i not in pool]
    if missing:
        raise DataFormatError(
            f"{pass_rates_path} scores problems that are not in {pool_path}: {missing[:5]} "
            "(was the pool regenerated after scoring?)"
        )
    rate = dict(zip(table["id"].astype(str), table["pass_rate"].astype(float)))
    chosen = [_rl_problem(pool[i], rate[i], selection.buckets[i]) for i in selection.ids]
    if not chosen:
        raise DataFormatError(
            f"no problem of {pass_rates_path} has {f.low} < pass rate < {f.high}; "
            "the RL set would be empty (is the SFT model trained? widen filter.low / filter.high)"
        )
    stats = {**selection.stats, "target_source": f.target_pass_rates or ("config" if f.target_histogram else None)}
    stats_out.parent.mkdir(parents=True, exist_ok=True)
    stats_out.write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    plot_pass_rate_histogram(
        table,
        set(selection.ids),
        f,
        histogram_out,
        title=f"RL pool difficulty for the SFT model: {len(chosen)} of {len(table)} selected",
    )
    write_records(chosen, out)  # last: a failure above leaves no RL set that looks complete
    return stats


def main(argv: list[str]) -> int:
    parser = stage_parser("filter", __doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    p_score = add_command(commands, "score", "k graded rollouts per RL-pool problem -> pass rates")
    p_score.add_argument("--model", type=Path, required=True, help="the SFT model folder")
    p_score.add_argument("--pool", type=Path, required=True, help="normalized RL-pool parquet")
    p_score.add_argument("--out", type=Path, required=True, help="output: pass_rates.parquet")
    p_score.add_argument("--samples", type=Path, required=True, help="output: graded samples (jsonl)")
    p_score.add_argument("--threads", type=int, help="CPU threads for torch (the rule's threads)")
    p_shard = add_command(commands, "score-shard", "one shard of the pool -> its shard file (resumable)")
    p_shard.add_argument("--model", type=Path, required=True, help="the SFT model folder")
    p_shard.add_argument("--pool", type=Path, required=True, help="normalized RL-pool parquet")
    add_shard_arguments(p_shard, "filter.shards")
    p_gather = add_command(commands, "gather", "shard files -> pass_rates.parquet and samples.jsonl")
    p_gather.add_argument("--pool", type=Path, required=True, help="normalized RL-pool parquet")
    p_gather.add_argument("--shard-files", type=Path, nargs="+", required=True, help="every shard file")
    p_gather.add_argument("--out", type=Path, required=True, help="output: pass_rates.parquet")
    p_gather.add_argument("--samples", type=Path, required=True, help="output: graded samples (jsonl)")
    p_record = add_command(commands, "scoring-config", "what the pass rates are computed from -> scoring_config.json")
    p_record.add_argument("--model-config", type=Path, required=True, help="the SFT model's config.json")
    p_record.add_argument("--pool", type=Path, required=True, help="normalized RL-pool parquet")
    p_record.add_argument("--out", type=Path, required=True, help="output: scoring_config.json")
    p_select = add_command(commands, "select", "band + histogram matching -> the RL training set")
    p_select.add_argument("--pass-rates", type=Path, required=True, help="pass_rates.parquet of the SFT model")
    p_select.add_argument("--pool", type=Path, required=True, help="normalized RL-pool parquet")
    p_select.add_argument("--out", type=Path, required=True, help="output: the RL training parquet")
    p_select.add_argument("--stats", type=Path, required=True, help="output: stats.json")
    p_select.add_argument("--histogram", type=Path, required=True, help="output: the pass-rate histogram (PNG)")
    args = parser.parse_args(argv)
    setup_logging()
    cfg = config_from_args(args)
    if args.command in ("score", "score-shard"):
        outputs = [(args.out, "--out", "file")] + (
            [(args.samples, "--samples", "file")] if args.command == "score" else []
        )
        check_writable(*outputs)
        check_model_folder(args.model, "--model")
        from agentrl.cpus import set_torch_threads

        set_torch_threads(args.threads)
    if args.command == "score":
        score(cfg, args.model, args.pool, args.out, args.samples)
    elif args.command == "score-shard":
        score_shard(cfg, args.model, args.pool, args.shard, args.shards, args.out, args.problems_per_chunk)
    elif args.command == "gather":
        check_writable((args.out, "--out"), (args.samples, "--samples"))
        gather(cfg.filter.k, args.pool, args.shard_files, args.out, args.samples)
    elif args.command == "scoring-config":
        check_writable((args.out, "--out"))
        write_scoring_record(cfg, args.model_config, args.pool, args.out)
    else:
        check_writable((args.out, "--out"), (args.stats, "--stats"), (args.histogram, "--histogram"))
        stats = select(cfg, args.pass_rates, args.pool, args.out, args.stats, args.histogram)
        log.info(
            "selected %s of %s scored problems; per bucket %s",
            stats["selected"]["total"],
            stats["scored"]["total"],
            {b: stats["selected"][b] for b in ("easy", "medium", "hard")},
        )
    return 0
