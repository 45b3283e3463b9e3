"""``python -m agentrl rollout``: multi-turn agentic rollouts of a model on a problem file.

Writes one :class:`~agentrl.data.records.Trajectory` JSON object per line, ordered by problem
then sample index. With ``--score`` each line also carries the reward
(``agentrl.rewards.RewardFunction``: ``reward`` is the shaped score; ``extra`` holds ``acc``,
``pred`` and the reward details). The engine, limits and sampling settings come from the
``rollout:`` config section; ``--temperature``/``--top-p`` override it.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import Counter
from pathlib import Path

from agentrl.config import ConfigError, add_config_arguments, config_from_args
from agentrl.model.folder import check_model_folder
from agentrl.paths import check_writable
from agentrl.stage_cli import setup_logging, stage_parser

log = logging.getLogger("agentrl.rollout")


def _parser() -> argparse.ArgumentParser:
    parser = stage_parser("rollout", __doc__.split("\n\n")[1])
    parser.add_argument("--model", required=True, type=Path, help="Hugging Face model folder")
    parser.add_argument("--problems", required=True, type=Path, help="normalized problem parquet")
    parser.add_argument("--n", type=int, default=1, help="samples per problem (default 1)")
    parser.add_argument("--out", required=True, type=Path, help="output .jsonl, one trajectory a line")
    parser.add_argument("--score", action="store_true", help="grade every trajectory with the reward function")
    parser.add_argument("--temperature", type=float, help="override rollout.temperature (0: greedy)")
    parser.add_argument("--top-p", type=float, help="override rollout.top_p")
    parser.add_argument("--seed", type=int, help="sampling seed (default: the config's seed)")
    parser.add_argument("--limit", type=int, help="only the first LIMIT problems")
    parser.add_argument(
        "--threads", type=int, help="torch intra-op threads (1 is fastest for tiny models on a busy CPU)"
    )
    add_config_arguments(parser)
    return parser


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.n < 1:
        parser.error(f"--n must be >= 1, got {args.n}")
    if args.temperature is not None and args.temperature < 0:
        parser.error(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        parser.error(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if not (args.model / "config.json").exists():
        parser.error(f"--model {args.model}: not a Hugging Face model folder (no config.json)")
    if not args.problems.exists():
        parser.error(f"--problems {args.problems}: no such file")


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _check(parser, args)
    setup_logging()
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        parser.error(str(exc))
    check_writable((args.out, "--out", "file"))
    check_model_folder(args.model, "--model")

    from agentrl.cpus import set_torch_threads
    from agentrl.data.records import read_problems
    from agentrl.rollout import AgentLoop, SamplingParams, make_engine
    from agentrl.tools.code_interpreter import CodeInterpreter
    from agentrl.tools.factory import make_sandbox
    from agentrl.tools.health import InfraFailureBound

    set_torch_threads(args.threads)
    problems = read_problems(args.problems)[: args.limit]
    params = SamplingParams.from_config(cfg.rollout)
    overrides = {k: v for k, v in (("temperature", args.temperature), ("top_p", args.top_p)) if v is not None}
    params = params.replace(**overrides)
    seed = cfg.seed if args.seed is None else args.seed

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    engine = make_engine(cfg.rollout, str(args.model), tokenizer=tokenizer)
    with make_sandbox(cfg.sandbox) as sandbox:
        loop = AgentLoop(
            engine,
            tokenizer,
            CodeInterpreter(sandbox, cfg.tool),
            cfg.rollout,
            InfraFailureBound.from_config(cfg.sandbox),
        )
        started = time.perf_counter()
        trajectories = loop.run(problems, args.n, params, seed)
        elapsed = time.perf_counter() - started
        if args.score:
            _score(trajectories, {p.id: p for p in problems}, cfg, sandbox)
    _write_jsonl(trajectories, args.out)
    _log_summary(trajectories, loop.stats, elapsed)
    return 0


def _score(trajectories, problems_by_id, cfg, sandbox) -> None:
    from agentrl.rewards import RewardFunction, leave_out_lost_rewards

    reward_fn = RewardFunction(cfg.reward, sandbox)
    items = [(problems_by_id[t.problem_id], t.text, len(t.response_ids), len(t.tool_calls)) for t in trajectories]
    results = reward_fn.score_many(items)
    leave_out_lost_rewards(trajectories, results)
    for trajectory, result in zip(trajectories, results):
        trajectory.reward = result.score
        trajectory.extra.update({"acc": result.acc, "pred": result.pred, "reward_details": result.details})


def _write_jsonl(trajectories, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for trajectory in trajectories:
            fh.write(json.dumps(trajectory.to_json(), ensure_ascii=False, default=str) + "\n")
    tmp.replace(path)  # a killed job never leaves a half-written file that looks complete


def _log_summary(trajectories, stats, elapsed: float) -> None:
    reasons = Counter(t.finish_reason for t in trajectories)
    calls = sum(len(t.tool_calls) for t in trajectories)
    failed = sum(sum(t.tool_errors) for t in trajectories)
    log.info(
        "%d trajectories in %.1f s (%.0f generated tokens/s); finish %s; %.2f turns and %.2f tool calls each, "
        "%.0f%% of calls failed",
        len(trajectories),
        elapsed,
        stats.generated_tokens / max(elapsed, 1e-9),
        dict(reasons),
        sum(t.num_turns for t in trajectories) / max(len(trajectories), 1),
        calls / max(len(trajectories), 1),
        100.0 * failed / max(calls, 1),
    )
    scored = [t for t in trajectories if t.reward is not None]
    if scored:
        log.info(
            "mean reward %.3f, accuracy %.3f",
            sum(t.reward for t in scored) / len(scored),
            sum(bool(t.extra.get("acc")) for t in scored) / len(scored),
        )
