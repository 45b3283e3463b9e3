"""``python -m agentrl prepare-data``: write the normalized SFT, RL-pool and eval parquet files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from agentrl.config import Config, RewardConfig, add_config_arguments, config_from_args
from agentrl.data import prompt_fit, upstream
from agentrl.data.records import write_records
from agentrl.hub import check_sources
from agentrl.model.folder import check_model_folder
from agentrl.paths import check_writable
from agentrl.rewards.ground_truth import checked_problems
from agentrl.stage_cli import setup_logging, stage_parser

log = logging.getLogger("agentrl.prepare_data")


def _embedded(cfg: Config):
    from agentrl.data import embedded, reasoning_modes, stitched
    from agentrl.tools.code_interpreter import CodeInterpreter
    from agentrl.tools.factory import make_sandbox

    e = cfg.data.embedded
    # data.embedded.sft_trajectories -> who writes the SFT conversations (the data ablation); real
    # ones in data.embedded.reasoning_mode (the reasoning ablation; the config refuses it with stitched).
    writer = stitched.StitchedSolver if e.sft_trajectories == "stitched" else reasoning_modes.WRITERS[e.reasoning_mode]
    with make_sandbox(cfg.sandbox) as sandbox:
        interpreter = CodeInterpreter(sandbox, cfg.tool)

        def run_program(jobs):
            results = sandbox.run_many(jobs)
            failed = [(code, r) for (code, _), r in zip(jobs, results) if r.status != "ok"]
            if failed:
                raise RuntimeError(f"a reference solution failed in the sandbox: {failed[0]}")
            return [r.stdout for r in results]

        return embedded.generate(
            e,
            cfg.seed,
            execute=lambda code: interpreter.execute(code).text,
            run_program=run_program,
            trajectory_writer=writer,
        )


def route_sources(problem_sets: dict[str, list], reward: RewardConfig) -> dict[str, dict[str, int]]:
    """``{family: {data_source: rows}}`` of every problem; an unroutable source fails here, before any rollout."""
    from agentrl.rewards.registry import UnknownDataSourceError, family_of

    routes: dict[str, dict[str, int]] = {}
    for name, problems in problem_sets.items():
        for problem in problems:
            try:
                family = family_of(problem.data_source, reward.unknown_source)
            except UnknownDataSourceError as exc:
                raise UnknownDataSourceError(f"{name}: problem {problem.id!r}: {exc}") from None
            by_source = routes.setdefault(family, {})
            by_source[problem.data_source] = by_source.get(problem.data_source, 0) + 1
    return routes


def prepare(cfg: Config, sft_out: Path, rl_out: Path, eval_dir: Path) -> dict[str, int]:
    if cfg.data.source == "embedded":
        dataset = _embedded(cfg)
        sft, rl_pool, eval_sets = dataset.sft, dataset.rl_pool, dataset.eval_sets
    else:
        sft, rl_pool, eval_sets = _upstream(cfg)
    problem_sets = {"rl_pool": rl_pool, **{f"eval/{k}": v for k, v in eval_sets.items()}}
    kept = {}
    for name, problems in problem_sets.items():  # the shared checks, each row's verifier's and its tests'
        problem_sets[name], kept[name] = checked_problems(problems, name, cfg.reward)
    routes = route_sources(problem_sets, cfg.reward)
    log.info("reward routing (data_source -> verifier family, rows): %s", json.dumps(routes, sort_keys=True))
    for name, kinds in kept.items():
        if kinds:
            log.warning(
                "%s: kept %d row(s) the project's checks refuse, graded as upstream grades them "
                "(reward.invalid_ground_truth: score; each marked in extra.kept_as_released), by kind: %s",
                name,
                sum(kinds.values()),
                json.dumps(kinds, ensure_ascii=False),
            )
    write_records(sft, sft_out)
    write_records(problem_sets["rl_pool"], rl_out)
    for name in eval_sets:
        write_records(problem_sets[f"eval/{name}"], eval_dir / f"{name}.parquet")
    counts = {"sft": len(sft), **{name: len(problems) for name, problems in problem_sets.items()}}
    return counts | {f"kept_as_released/{name}": sum(kinds.values()) for name, kinds in kept.items() if kinds}


def _upstream(cfg: Config):
    """The released SFT, RL and eval files, normalized (:mod:`agentrl.data.upstream`)."""
    up, reward = cfg.data.upstream, cfg.reward
    keep, raw_code = reward.invalid_ground_truth == "score", reward.code_ground_truth == "literal_eval"
    sft_rows = upstream.read_rows(up.sft, up.max_sft_rows, "data.upstream.sft")
    sft = upstream.normalize_sft(sft_rows, upstream.source_name(up.sft), up.sft_tool_arguments)
    rl_rows = upstream.read_rows(up.rl, up.max_rl_rows, "data.upstream.rl")
    rl_pool = upstream.normalize_rl(rl_rows, upstream.source_name(up.rl), up.rl_prompt_wrapping, raw_code, keep)
    eval_sets = {
        name: upstream.normalize_eval(
            name, upstream.read_rows(source, key=f"data.upstream.eval.{name}"), upstream.source_name(source), keep
        )
        for name, source in up.eval.items()
    }
    return sft, rl_pool, eval_sets


def main(argv: list[str]) -> int:
    parser = stage_parser("prepare-data", __doc__)
    add_config_arguments(parser)
    parser.add_argument("--sft", type=Path, required=True, help="output: normalized SFT parquet")
    parser.add_argument("--rl-pool", type=Path, required=True, help="output: normalized RL-pool parquet")
    parser.add_argument("--eval-dir", type=Path, required=True, help="output folder: <benchmark>.parquet")
    args = parser.parse_args(argv)
    setup_logging()
    cfg = config_from_args(args)
    check_writable(
        (args.sft, "--sft", "file"), (args.rl_pool, "--rl-pool", "file"), (args.eval_dir / "x.parquet", "--eval-dir")
    )
    check_sources(cfg)
    counts = prepare(cfg, args.sft, args.rl_pool, args.eval_dir)
    log.info("wrote %s", json.dumps(counts))
    return 0


def fit_prompts_main(argv: list[str]) -> int:
    """``python -m agentrl fit-prompts``: drop the prompts over a token limit (:mod:`agentrl.data.prompt_fit`)."""
    parser = stage_parser("fit-prompts", prompt_fit.__doc__.split("\n\n")[0])
    add_config_arguments(parser)
    parser.add_argument("--model", type=Path, required=True, help="model folder whose tokenizer measures the prompts")
    parser.add_argument(
        "--limit",
        choices=["rollout", "eval"],
        required=True,
        help="rollout.max_prompt_tokens or eval.max_prompt_tokens",
    )
    parser.add_argument(
        "--problems", type=Path, nargs="+", required=True, help="normalized problem parquets (prepare-data)"
    )
    parser.add_argument("--out-dir", type=Path, required=True, help="output folder: the kept problems, same file names")
    parser.add_argument("--stats", type=Path, required=True, help="output: counts per file and data source (JSON)")
    args = parser.parse_args(argv)
    setup_logging()
    cfg = config_from_args(args)
    check_model_folder(args.model, "--model")  # its tokenizer renders the prompts with the chat template
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    limit = cfg.rollout.max_prompt_tokens if args.limit == "rollout" else cfg.eval.max_prompt_tokens
    with_tools, overlong = cfg.rollout.prompt_length_with_tools, cfg.rollout.overlong_prompts
    stats = {
        source.stem: prompt_fit.fit_file(source, args.out_dir / source.name, tokenizer, limit, with_tools, overlong)
        for source in args.problems
    }
    args.stats.parent.mkdir(parents=True, exist_ok=True)
    args.stats.write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return 0


def copy_corpus_main(argv: list[str]) -> int:
    """``python -m agentrl copy-corpus``: the embedded model's pretraining conversations (:mod:`agentrl.data.copy_corpus`)."""
    from agentrl.data.copy_corpus import copy_corpus

    parser = stage_parser("copy-corpus", "write the copying conversations the embedded base model is pretrained on")
    add_config_arguments(parser)
    parser.add_argument("--out", type=Path, required=True, help="output: an SFT parquet (agentrl.data.records)")
    args = parser.parse_args(argv)
    setup_logging()
    cfg = config_from_args(args)
    check_writable((args.out, "--out", "file"))
    pretrain = cfg.model.embedded.pretrain
    write_records(
        copy_corpus(
            pretrain.conversations, cfg.seed, pretrain.max_spans, pretrain.verbatim_share, pretrain.letter_share
        ),
        args.out,
    )
    log.info(
        "%d copying conversations (at most %d spans each) -> %s", pretrain.conversations, pretrain.max_spans, args.out
    )
    return 0
