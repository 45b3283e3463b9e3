"""``python -m agentrl filter score|select``: model-aware RL data filtering (docs/recipe.md section 6).

- ``score``: the SFT model makes ``filter.k`` agentic rollouts of every RL-pool problem (the RL
  rollout engine and reward registry) -> the pass-rate table and the graded samples.
- ``select``: the band and the optional histogram matching (:mod:`agentrl.filtering.selection`)
  -> the RL training set (normalized Problems), the counts that explain it, and a histogram.

The two are separate stages so that changing a threshold re-runs only the cheap selection.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from agentrl.cli_help import HelpFormatter
from agentrl.config import Config, add_config_arguments, config_from_args
from agentrl.data.records import Problem, read_problems, write_records
from agentrl.errors import DataFormatError
from agentrl.evaluation.samples import write_jsonl
from agentrl.filtering.histogram import plot_pass_rate_histogram
from agentrl.filtering.pass_rates import pass_rate_table, read_pass_rates, write_pass_rates
from agentrl.filtering.selection import select_problems, target_shares_from_table
from agentrl.model.folder import check_model_folder
from agentrl.paths import check_writable
from agentrl.stage_cli import setup_logging, stage_parser

log = logging.getLogger("agentrl.filter")


def score(cfg: Config, model_dir: Path, pool_path: Path, pass_rates_out: Path, samples_out: Path) -> None:
    from agentrl.evaluation.sampling import SamplingSetup, graded_sample_rows

    problems = read_problems(pool_path)
    f = cfg.filter
    setup = SamplingSetup(n=f.k, temperature=f.temperature, top_p=f.top_p, seed=cfg.seed, seed_tag="filter.score")
    log.info(
        "scoring %d problems of %s with %s: k=%d, temperature=%g, top_p=%g",
        len(problems),
        pool_path,
        model_dir,
        f.k,
        f.temperature,
        f.top_p,
    )
    started = time.perf_counter()
    rows = []

    def keep(stream):
        # The samples file gets each row as it comes; the table keeps only the counts it needs
        # (texts of 240K paper-scale rollouts would not fit in memory).
        for row in stream:
            rows.append({key: row[key] for key in ("problem_id", "acc", "score", "tool_calls", "response_length")})
            yield row

    write_jsonl(keep(graded_sample_rows(cfg, str(model_dir), problems, setup)), samples_out)
    table = pass_rate_table(problems, rows, f.k)
    write_pass_rates(table, pass_rates_out)
    log.info(
        "mean pass rate %.3f; solved never %d, always %d, of %d; %.1f s",
        table["pass_rate"].mean(),
        int((table["pass_rate"] == 0).sum()),
        int((table["pass_rate"] == 1).sum()),
        len(table),
        time.perf_counter() - started,
    )


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
    pool = {p.id: p for p in read_problems(pool_path)}
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
    p_score = commands.add_parser(
        "score",
        help="k graded rollouts per RL-pool problem -> pass rates",
        formatter_class=HelpFormatter,
    )
    add_config_arguments(p_score)
    p_score.add_argument("--model", type=Path, required=True, help="the SFT model folder")
    p_score.add_argument("--pool", type=Path, required=True, help="normalized RL-pool parquet")
    p_score.add_argument("--out", type=Path, required=True, help="output: pass_rates.parquet")
    p_score.add_argument("--samples", type=Path, required=True, help="output: graded samples (jsonl)")
    p_score.add_argument("--threads", type=int, help="CPU threads for torch (the rule's threads)")
    p_select = commands.add_parser(
        "select",
        help="band + histogram matching -> the RL training set",
        formatter_class=HelpFormatter,
    )
    add_config_arguments(p_select)
    p_select.add_argument("--pass-rates", type=Path, required=True, help="pass_rates.parquet of the SFT model")
    p_select.add_argument("--pool", type=Path, required=True, help="normalized RL-pool parquet")
    p_select.add_argument("--out", type=Path, required=True, help="output: the RL training parquet")
    p_select.add_argument("--stats", type=Path, required=True, help="output: stats.json")
    p_select.add_argument("--histogram", type=Path, required=True, help="output: the pass-rate histogram (PNG)")
    args = parser.parse_args(argv)
    setup_logging()
    cfg = config_from_args(args)
    if args.command == "score":
        check_writable((args.out, "--out"), (args.samples, "--samples"))
        check_model_folder(args.model, "--model")
        from agentrl.training.threads import set_torch_threads

        set_torch_threads(args.threads)
        score(cfg, args.model, args.pool, args.out, args.samples)
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
