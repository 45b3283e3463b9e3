"""A 2-process GRPO step whose rank-0 prompts run several times longer than rank 1's, prompts
shared through the claim queue (``grpo.rollout_queue: shared``) or split by position (``fixed``).

    python benchmarks/rollout_queue.py --model results/models/sft --train results/filter/rl_train.parquet \\
        --samples results/filter/samples.jsonl [--prompts 8 --n 4 --pairs 3]

The step's prompts are the ``--prompts / 2`` problems of the RL set with the longest responses and
the ``--prompts / 2`` with the shortest, by their mean ``response_length`` in ``--samples`` (the
scoring stage's samples of the same model), interleaved long, short, long, ... so that the fixed
split gives every long one to rank 0. Each (round, arm) is one torchrun of two CPU processes
(gloo, one thread each) that builds the trainer's own parts (``build_components``: DeepSpeed
actor, hf engine, agent loop, sandbox, reward) and times one :meth:`GrpoStep.run` after a barrier;
the step's time is the slower rank's. Both arms use the same step number, so they roll out the
same trajectories (the seeds are per problem, sample and turn) and differ only in which rank rolls
out which group. Arms alternate A B B A; the report gives per arm the median, per-round ratios
(shared / fixed), each rank's groups and rollout seconds, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

WORKER = """
import json, sys, time
from pathlib import Path
import torch
from agentrl.config import load_config
from agentrl.data.records import read_problems
from agentrl.grpo.prompts import PromptSampler
from agentrl.grpo.step import GrpoStep
from agentrl.grpo.trainer import GrpoPaths, build_components
from agentrl.tools.factory import make_sandbox
from agentrl.training import deepspeed_engine as dse

args = json.loads(sys.argv[1])
torch.set_num_threads(1)
cfg = load_config({"grpo": {"batch_prompts": args["prompts"], "n": args["n"], "mini_batch_prompts": args["prompts"],
                            "rollout_queue": args["arm"]}, "sandbox": {"workers": 1}})
ctx = dse.init_distributed(30.0)
paths = GrpoPaths(Path(args["model"]), Path(args["batch"]), (), *[Path("-")] * 3, dse.find_deepspeed_config(0))
with make_sandbox(cfg.sandbox) as sandbox:
    parts, _ = build_components(cfg, paths, ctx, sandbox, steps=1)
    step = GrpoStep(parts)
    sampler = PromptSampler(read_problems(paths.train), seed=0, shuffle=False)
    torch.distributed.barrier()
    started = time.perf_counter()
    record = step.run(1, sampler)
    own = time.perf_counter() - started
    torch.distributed.barrier()
    wall = time.perf_counter() - started
with open(args["out"] + f".{ctx.rank}", "w") as f:
    json.dump({"own_s": own, "step_s": wall, "rollout_s": record["timing/rollout_s"], "update_s": record["timing/update_s"],
               "max_share": record["rollout/groups_rank_max_share"], "response_mean": record["rollout/response_length_mean"],
               "reward_mean": record["rollout/reward_mean"]}, f)
dse.close_distributed()
"""


def step_batch(train: Path, samples: Path, prompts: int, folder: Path) -> tuple[Path, list[float]]:
    """The step's problems (long, short, long, ...) as a parquet, and their mean response lengths."""
    from agentrl.data.records import read_problems, write_records

    lengths: dict[str, list[int]] = defaultdict(list)
    for line in samples.read_text().splitlines():
        row = json.loads(line)
        lengths[row["problem_id"]].append(row["response_length"])
    problems = [p for p in read_problems(train) if p.id in lengths]
    problems.sort(key=lambda p: statistics.mean(lengths[p.id]))
    half = prompts // 2
    short, long = problems[:half], problems[-half:][::-1]
    batch = [p for pair in zip(long, short) for p in pair]
    write_records(batch, folder / "batch.parquet")
    return folder / "batch.parquet", [statistics.mean(lengths[p.id]) for p in batch]


def run_arm(args, arm: str, batch: Path, folder: Path) -> dict:
    script = folder / "worker.py"
    script.write_text(WORKER)
    out = folder / f"{arm}.json"
    payload = {"model": str(args.model), "batch": str(batch), "prompts": args.prompts, "n": args.n}
    payload.update(arm=arm, out=str(out))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    done = subprocess.run(
        command + [json.dumps(payload)], env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{arm}: torchrun failed\n{done.stderr[-4000:]}")
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    return {
        "step_s": max(r["step_s"] for r in ranks),
        "rank_rollout_s": [round(r["rollout_s"], 2) for r in ranks],
        "rank_update_s": [round(r["update_s"], 2) for r in ranks],
        "groups_rank_max_share": ranks[0]["max_share"],
        "response_mean": ranks[0]["response_mean"],
        "reward_mean": ranks[0]["reward_mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--train", type=Path, required=True)
    parser.add_argument("--samples", type=Path, required=True, help="the scoring stage's samples.jsonl")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.prompts % 4:
        parser.error("--prompts must be a multiple of 4 (two ranks, long and short halves)")
    rounds = []
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        batch, lengths = step_batch(args.train, args.samples, args.prompts, folder)
        rank0 = statistics.mean(lengths[0::2])
        rank1 = statistics.mean(lengths[1::2])
        print(
            json.dumps({"cpus": os.cpu_count(), "load_average": os.getloadavg(), "fixed_rank_lengths": [rank0, rank1]})
        )
        for index in range(args.pairs):
            order = ("fixed", "shared") if index % 2 == 0 else ("shared", "fixed")
            result = {arm: run_arm(args, arm, batch, folder) for arm in order}
            result["load_average"] = os.getloadavg()[0]
            rounds.append(result)
            print(json.dumps({"round": index, **result}), flush=True)
    ratios = [r["shared"]["step_s"] / r["fixed"]["step_s"] for r in rounds]
    summary = {
        "command": " ".join(sys.argv),
        "fixed_median_s": statistics.median(r["fixed"]["step_s"] for r in rounds),
        "shared_median_s": statistics.median(r["shared"]["step_s"] for r in rounds),
        "shared/fixed": statistics.median(ratios),
        "ratios": [round(x, 3) for x in ratios],
        "load_average_end": os.getloadavg(),
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({**summary, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
