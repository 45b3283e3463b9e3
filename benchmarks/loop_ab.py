"""The agent loop of one checkout, timed: run it under two checkouts' sources to compare versions.

    PYTHONPATH=/path/to/old/src python benchmarks/loop_ab.py --model results/models/sft \\
        --problems results/data/rl_pool.parquet
    PYTHONPATH=src python benchmarks/loop_ab.py --model ... --problems ...

Uses only the API every version has (``load_config``, ``make_engine``, ``AgentLoop.run``) with
the rollout settings of the checkout's own defaults, so the two arms sample the same
trajectories when their seeds agree (compare ``generated``). Prints one JSON line: wall time,
generated tokens, tokens/s, the load average. Run the arms one after the other, several times.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="Hugging Face model folder")
    parser.add_argument("--problems", required=True, type=Path, help="normalized problem parquet")
    parser.add_argument("--prompts", type=int, default=32, help="problems, spread over the file (default 32)")
    parser.add_argument("--n", type=int, default=8, help="samples per problem (default 8)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    import agentrl
    from agentrl.config import load_config
    from agentrl.data.records import read_problems
    from agentrl.rollout import AgentLoop, SamplingParams, make_engine
    from agentrl.tools.code_interpreter import CodeInterpreter
    from agentrl.tools.factory import make_sandbox

    torch.set_num_threads(args.threads)
    cfg = load_config({"sandbox": {"workers": 2}})
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    engine = make_engine(cfg.rollout, str(args.model), tokenizer=tokenizer)
    problems = read_problems(args.problems)
    problems = problems[:: max(1, len(problems) // args.prompts)][: args.prompts]
    params = SamplingParams.from_config(cfg.rollout)
    with make_sandbox(cfg.sandbox) as sandbox:
        loop = AgentLoop(engine, tokenizer, CodeInterpreter(sandbox, cfg.tool), cfg.rollout)
        loop.run(problems[:2], 2, params, seed=1)  # warm-up
        started = time.perf_counter()
        loop.run(problems, args.n, params, seed=0)
        wall = time.perf_counter() - started
    generated = loop.stats.generated_tokens
    print(
        json.dumps(
            {
                "source": str(Path(agentrl.__file__).parent),
                "wall_s": round(wall, 2),
                "generated": generated,
                "tokens_per_s": round(generated / wall),
                "load": Path("/proc/loadavg").read_text().split()[:3],
            }
        )
    )


if __name__ == "__main__":
    main()
