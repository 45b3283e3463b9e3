"""GRPO's update over two ranks of uneven loads, samples redistributed (grpo.balance_ranks) or not.

    python benchmarks/balance.py [--pairs 5 --skew 4 --prompts 4 --n 8 --median 300 --budget 2048]

Each rank rolls out ``--prompts / 2`` prompt groups; rank 0's responses are ``--skew`` times as
long as rank 1's (lognormal around ``--median``, as a rank whose prompts led to long agentic
trajectories). Each round starts one torchrun of two CPU processes (gloo, one thread each, real
DeepSpeed ZeRO-2, the embedded model's shape) per arm, arms alternated A B B A; a process times
the recomputation pass and the update (:meth:`GrpoStep.balanced`, :meth:`GrpoStep.plan`,
:meth:`GrpoStep.update`, one optimizer step) after a barrier, and the step's time is the slower
rank's. The report gives per arm the median and per-round ratios (balanced / fixed) and the load.
The rollouts themselves are not run: what a shared rollout queue would change is not measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = """
import json, math, sys, time
import torch
sys.path.insert(0, {benchmarks!r})
from packing import model_config
from agentrl.config import load_config
from agentrl.grpo.batching import PolicySample
from agentrl.grpo.policy import ResponseLogProbs
from agentrl.grpo.step import Components, GrpoStep
from agentrl.grpo.trainer import GrpoPaths, build_engine
from agentrl.grpo.variants import resolve_algorithm
from agentrl.training import deepspeed_engine as dse
from pathlib import Path
from transformers import Qwen3ForCausalLM

args = json.loads(sys.argv[1])
torch.set_num_threads(1)
ctx = dse.init_distributed(10.0)
groups = args["prompts"] // 2
median = args["median"] * (args["skew"] if ctx.rank == 0 else 1)
generator = torch.Generator().manual_seed(100 + ctx.rank)
samples = []
for _ in range(groups):
    prompt = torch.randint(5, 600, (100,), generator=generator).tolist()
    for _ in range(args["n"]):
        length = max(1, min(4 * median, round(median * math.exp(0.5 * float(torch.randn(1, generator=generator))))))
        response = torch.randint(5, 600, (length,), generator=generator).tolist()
        samples.append(PolicySample(prompt + response, 100, [1] * length, [0.0] * length, float(torch.randn(1, generator=generator))))
cfg = load_config({{"grpo": {{"n": args["n"], "batch_prompts": args["prompts"], "mini_batch_prompts": args["prompts"],
                             "micro_batch_tokens": args["budget"], "balance_ranks": args["balance"],
                             "deepspeed": {{"zero_stage": 2}}}}}})
torch.manual_seed(0)
model = Qwen3ForCausalLM(model_config(4 * args["median"] * args["skew"] + 200))
actor = ResponseLogProbs(model, logit_chunk_tokens=4096, temperature=1.0)
paths = GrpoPaths(*[Path("-")] * 2, (), *[Path("-")] * 3, dse.find_deepspeed_config(2))
engine = build_engine(actor, cfg, paths, ctx, torch.float32, steps=1)
step = GrpoStep(Components(cfg, resolve_algorithm(cfg.grpo), ctx, engine, None, None, None, None, pad_token_id=0))
torch.distributed.barrier()
started = time.perf_counter()
# rank r rolled out groups r, r + W, ... (grpo.rollout_queue: fixed); as GrpoStep.run
keys = [(0, k * ctx.world_size + ctx.rank) for k in range(groups)]
samples, minis = step.distribute(samples, keys)
plan = step.plan(groups, samples, minis)
with torch.no_grad():
    engine.module.eval()
    for micro in (mb for mini in plan for mb in mini.micro_batches if mb):
        engine.module(step.micro_batch(samples, micro))
    engine.module.train()
step.update(samples, plan)
own = time.perf_counter() - started
tokens = sum(len(samples[i].input_ids) for mini in plan for mb in mini.micro_batches for i in mb)
torch.distributed.barrier()
with open(args["out"] + f".{{ctx.rank}}", "w") as f:
    json.dump({{"seconds": own, "tokens": tokens, "step_seconds": time.perf_counter() - started}}, f)
"""


def run_arm(args, balance: bool, folder: Path) -> dict:
    script = folder / "worker.py"
    script.write_text(WORKER.format(benchmarks=str(Path(__file__).parent)))
    out = folder / f"{'balanced' if balance else 'fixed'}.json"
    payload = {**vars(args), "balance": balance, "out": str(out), "json": None}
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    subprocess.run(
        command + [json.dumps(payload)], env={**env, "OMP_NUM_THREADS": "1"}, check=True, capture_output=True
    )
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    return {
        "step_seconds": max(r["step_seconds"] for r in ranks),
        "rank_seconds": [round(r["seconds"], 3) for r in ranks],
        "rank_tokens": [r["tokens"] for r in ranks],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--skew", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--median", type=int, default=300)
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(json.dumps({"cpus": os.cpu_count(), "load_average": os.getloadavg()}))
    rounds = []
    with tempfile.TemporaryDirectory() as folder:
        for index in range(args.pairs):
            order = (False, True) if index % 2 == 0 else (True, False)
            result = {("balanced" if b else "fixed"): run_arm(args, b, Path(folder)) for b in order}
            result["load_average"] = os.getloadavg()[0]
            rounds.append(result)
            print(json.dumps({"round": index, **result}), flush=True)
    ratios = [r["balanced"]["step_seconds"] / r["fixed"]["step_seconds"] for r in rounds]
    summary = {
        "command": " ".join(sys.argv),
        "fixed_median_s": statistics.median(r["fixed"]["step_seconds"] for r in rounds),
        "balanced_median_s": statistics.median(r["balanced"]["step_seconds"] for r in rounds),
        "balanced/fixed": statistics.median(ratios),
        "ratios": [round(x, 3) for x in ratios],
        "load_average_end": os.getloadavg(),
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({**summary, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
