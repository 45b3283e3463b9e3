"""Synchronous GRPO against one-step-off on the embedded default: step time and what it learns.

    python benchmarks/staleness.py --default-run results [--seeds 1 2 3] [--out-dir results/staleness]

Two arms, each the real workflow's RL half (``benchmarks/robustness.py``'s RL arms: the RL-pool
scoring and selection, GRPO and the RL model's evaluation at a seed, from ``--default-run``'s SFT
model) in a results folder of its own:

- ``sync``: the embedded default, ``grpo.max_staleness: 0`` (one process rolls out, then trains,
  on the job's threads);
- ``one_step_off``: ``grpo.max_staleness: 1`` (``grpo.placement`` auto: separate), a rollout
  process and a trainer process with ``grpo.rollout_share`` of the threads each (one core each on
  a 2-core machine), step k + 1 rolled out while step k trains.

Per seed the arms run back to back, their order alternated from seed to seed. Per arm it reads
the GRPO steps' wall time (``timing/step_s`` of ``rl/metrics.jsonl``: from asking for a step's
rollouts to its weights reaching the rollout engine; in one-step-off the trainer waits only for
the part of the rollout that did not overlap the update, ``timing/rollout_wait_s``), the GRPO
job's wall time (``timings/grpo.tsv``: load, the steps, the export), RL - SFT in avg@n points
(from ``robustness.py --json``) and the load average. It prints per seed and per arm the median
step time, the one-step-off / sync ratios, and the RL - SFT of every seed with their spread.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ARMS = {"sync": {}, "one_step_off": {"grpo": {"max_staleness": 1}}}


def run_arm(name: str, seed: int, args, overlay: Path) -> dict:
    """One robustness.py RL arm; its step times, job time, RL - SFT and load."""
    out = args.out_dir / name
    report = out / f"robustness-s{seed}.json"
    command = [sys.executable, str(Path(__file__).parent / "robustness.py"), "--seeds", "--rl-seeds", str(seed)]
    command += ["--default-run", str(args.default_run), "--config-overlay", str(overlay)]
    command += ["--out-dir", str(out), "--json", str(report), "--cores", str(args.cores)]
    load_before = os.getloadavg()[0]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} seed {seed}: robustness.py failed\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    folder = out / f"rl-s{seed}"
    rows = [json.loads(line) for line in (folder / "rl" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "timing/step_s" in r]
    with open(folder / "timings" / "grpo.tsv") as handle:
        job_s = float(next(csv.DictReader(handle, delimiter="\t"))["s"])
    rl_row = next(r for r in json.loads(report.read_text())["rows"] if r["kind"] == "rl")
    return {
        "step_s_median": statistics.median(r["timing/step_s"] for r in steps),
        "step_s_total": sum(r["timing/step_s"] for r in steps),
        "rollout_wait_s_median": statistics.median(
            r.get("timing/rollout_wait_s", r["timing/rollout_s"]) for r in steps
        ),
        "update_s_median": statistics.median(r["timing/update_s"] for r in steps),
        "staleness_mean": statistics.mean(r.get("rollout/staleness", 0.0) for r in steps),
        "steps": len(steps),
        "grpo_job_s": job_s,
        "rl_minus_sft": rl_row["delta"],
        "rl_mean": rl_row["mean"],
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--default-run", type=Path, required=True, help="a finished results folder (its SFT model)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out-dir", type=Path, default=Path("results/staleness"))
    parser.add_argument("--cores", default="all")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        overlays = {}
        for name, overlay in ARMS.items():
            overlays[name] = Path(folder) / f"{name}.yaml"
            overlays[name].write_text(json.dumps(overlay))  # JSON is YAML
        for index, seed in enumerate(args.seeds):
            order = list(ARMS) if index % 2 == 0 else list(reversed(ARMS))
            row = {"seed": seed, **{name: run_arm(name, seed, args, overlays[name]) for name in order}}
            row["step_ratio"] = row["one_step_off"]["step_s_median"] / row["sync"]["step_s_median"]
            row["job_ratio"] = row["one_step_off"]["grpo_job_s"] / row["sync"]["grpo_job_s"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    gains = {name: [r[name]["rl_minus_sft"] for r in rows] for name in ARMS}
    summary = {
        "command": " ".join(sys.argv),
        "step_ratio_median": statistics.median(r["step_ratio"] for r in rows),
        "job_ratio_median": statistics.median(r["job_ratio"] for r in rows),
        "step_ratios": [round(r["step_ratio"], 3) for r in rows],
        "rl_minus_sft": gains,
        "rl_minus_sft_range": {name: [min(v), max(v)] for name, v in gains.items()},
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({**summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
