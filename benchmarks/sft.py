"""SFT training throughput: tokens/s of ``python -m agentrl sft`` per ZeRO stage and token budget.

Runs the real stage CLI (one epoch, or ``--steps`` steps' worth of data) on a model folder and an
SFT parquet, and reports the median tokens/s, step time and padding share from its metrics file.

    python benchmarks/sft.py --model results/models/base --data results/data/sft.parquet \
        --stages 0 2 --budgets none 2048 --nproc 1

Not a test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_once(
    model: Path, data: Path, stage: int, budget: int | None, nproc: int, threads: int, extra_sft: dict
) -> dict:
    with tempfile.TemporaryDirectory(prefix="sft-bench-") as tmp:
        sft = {
            "epochs": 1,
            "save_every_steps": 0,
            "micro_batch_tokens": budget,
            "deepspeed": {"zero_stage": stage},
            **extra_sft,
        }
        cmd = [
            sys.executable,
            "-m",
            "agentrl",
            "sft",
            "--config-json",
            json.dumps({"sft": sft}),
            "--model",
            str(model),
            "--data",
            str(data),
            "--out",
            f"{tmp}/model",
            "--metrics",
            f"{tmp}/metrics.jsonl",
            "--checkpoint-dir",
            f"{tmp}/ckpt",
            "--nproc",
            str(nproc),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        started = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode:
            raise SystemExit(f"sft failed (stage {stage}, budget {budget}):\n{done.stderr[-3000:]}")
        metrics = [json.loads(line) for line in Path(f"{tmp}/metrics.jsonl").read_text().splitlines()]
    steady = metrics[1:] or metrics  # the first step pays for warm-up
    return {
        "zero_stage": stage,
        "micro_batch_tokens": budget,
        "nproc": nproc,
        "steps": len(metrics),
        "tokens_per_s": statistics.median(m["tokens_per_s"] for m in steady),
        "step_time_s": statistics.median(m["step_time_s"] for m in steady),
        "pad_fraction": statistics.mean(m["pad_fraction"] for m in metrics),
        "wall_s_with_startup": wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--budgets", nargs="+", default=["none"], help="micro_batch_tokens values ('none' = off)")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per process")
    parser.add_argument("--sft-json", default="{}", help="extra sft keys, e.g. '{\"global_batch_size\": 8}'")
    args = parser.parse_args()
    for stage in args.stages:
        for raw in args.budgets:
            budget = None if raw == "none" else int(raw)
            print(
                json.dumps(
                    run_once(args.model, args.data, stage, budget, args.nproc, args.threads, json.loads(args.sft_json))
                ),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
