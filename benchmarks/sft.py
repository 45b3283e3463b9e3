"""SFT training throughput of arms of the sft config, measured interleaved: A B A B ...

Runs the real stage CLI (``python -m agentrl sft``) on a model folder and an SFT parquet, each arm
being the repository's ``config.yaml`` (or ``--config``) with a few ``sft`` keys overridden, for
``--steps`` optimizer steps (one epoch over ``steps x global_batch_size`` conversations spread
evenly over the data file: the embedded file lists its families one after the other, and its first
rows alone, all arithmetic and the shortest, made a step look 0.7x of the whole run's). Arms run
in turn, ``--pairs`` rounds, so a change in the machine's load hits every arm alike; each run's
figures are medians over its steps (the first pays for warm-up), and the report gives per arm the
median over rounds and, against the first arm, the median of the per-round ratios. Tokens are
real (not padding) tokens; ``pad_fraction`` is padded positions / all.

    python benchmarks/sft.py --model results/models/base --data results/data/sft.parquet \
        --arm greedy='{"micro_batch_overhead_tokens": null}' --arm grouped='{}' --pairs 3 --steps 40

An arm's ``"threads"`` key is not an sft key: it sets that arm's torch threads per process (the
rule's ``threads:``), so ``--arm t1='{"threads": 1}' --arm t2='{"threads": 2}'`` compares them;
its ``"nproc"`` key sets that arm's data-parallel processes (torchrun with gloo on CPU), so
``--arm p1='{"nproc": 1, "threads": 2}' --arm p2='{"nproc": 2, "threads": 1}'`` compares one
two-thread process with two one-thread processes on the same global batch.

Not a test: timings depend on the machine and its load (printed: CPU count, load average).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def merged(base: dict, overrides: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def subset(data: Path, rows: int, out: Path) -> Path:
    import pyarrow.parquet as pq

    table = pq.read_table(data)
    if rows > table.num_rows:
        raise SystemExit(f"{data} has {table.num_rows} conversations, fewer than the {rows} asked for")
    pq.write_table(table.take([i * table.num_rows // rows for i in range(rows)]), out)
    return out


def run_once(config: dict, model: Path, data: Path, nproc: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="sft-bench-") as tmp:
        cmd = [
            *(sys.executable, "-m", "agentrl", "sft", "--config-json", json.dumps(config)),
            *("--model", str(model), "--data", str(data), "--out", f"{tmp}/model"),
            *("--metrics", f"{tmp}/metrics.jsonl", "--checkpoint-dir", f"{tmp}/ckpt", "--nproc", str(nproc)),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        started = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode:
            raise SystemExit(f"sft failed:\n{done.stderr[-3000:]}")
        metrics = [json.loads(line) for line in Path(f"{tmp}/metrics.jsonl").read_text().splitlines()]
    steady = metrics[1:] or metrics  # the first step pays for warm-up
    return {
        "steps": len(metrics),
        "tokens_per_s": statistics.median(m["tokens_per_s"] for m in steady),
        "step_time_s": statistics.median(m["step_time_s"] for m in steady),
        "train_time_s": sum(m["step_time_s"] for m in metrics),
        "pad_fraction": statistics.mean(m["pad_fraction"] for m in metrics),
        "final_loss": metrics[-1]["loss"],
        "wall_s_with_startup": wall,
    }


def parse_arm(text: str) -> tuple[str, dict]:
    name, _, raw = text.partition("=")
    if not name or not raw:
        raise argparse.ArgumentTypeError(f"--arm takes NAME=JSON (sft keys), got {text!r}")
    return name, json.loads(raw)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument(
        "--config", type=Path, default=REPO / "config.yaml", help="the base config (default: the repo's)"
    )
    parser.add_argument("--arm", type=parse_arm, action="append", help="NAME=JSON of sft keys over the config")
    parser.add_argument("--pairs", type=int, default=5, help="rounds of every arm in turn")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per process (an arm's own wins)")
    args = parser.parse_args()
    arms = dict(args.arm or [("greedy", {"micro_batch_overhead_tokens": None}), ("config", {})])
    threads = {name: sft.pop("threads", args.threads) for name, sft in arms.items()}
    nproc = {name: sft.pop("nproc", args.nproc) for name, sft in arms.items()}
    base = yaml.safe_load(args.config.read_text()) or {}
    configs = {name: merged(base, {"sft": {"epochs": 1, "save_every_steps": 0, **sft}}) for name, sft in arms.items()}
    batch = {configs[name]["sft"].get("global_batch_size", 8) for name in arms}
    assert len(batch) == 1, "the arms must share sft.global_batch_size (the same steps of the same data)"
    print(json.dumps({"cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "config": str(args.config)}))
    results: dict[str, list[dict]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory(prefix="sft-bench-data-") as tmp:
        data = subset(args.data, args.steps * batch.pop(), Path(tmp) / "sft.parquet")
        for round_ in range(args.pairs):
            for name in arms:
                result = run_once(configs[name], args.model, data, nproc[name], threads[name])
                results[name].append(result)
                line = {
                    "round": round_,
                    "arm": name,
                    "nproc": nproc[name],
                    "threads": threads[name],
                    "loadavg": os.getloadavg()[0],
                    **result,
                }
                print(json.dumps(line), flush=True)
    first = next(iter(arms))
    for name, runs in results.items():
        summary = {key: statistics.median(r[key] for r in runs) for key in runs[0] if key != "steps"}
        ratios = {
            f"{key}_ratio_to_{first}": statistics.median(r[key] / f[key] for r, f in zip(runs, results[first]))
            for key in ("tokens_per_s", "train_time_s")
        }
        print(json.dumps({"arm": name, "median_over_rounds": summary, **ratios}))
    print(json.dumps({"loadavg_end": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
