"""GRPO and SFT with LoRA against full fine-tuning on the embedded default (not a test).

    python benchmarks/lora.py --default-run results [--seeds 1 2 3] [--ranks 1 8 32] [--lr-scale 10] \\
        [--sft-rank 32] [--out-dir results/lora] [--json results/lora.json]

GRPO arms, each the real workflow's RL half (``benchmarks/robustness.py``'s RL arms: GRPO and the RL
model's evaluation at a seed, from ``--default-run``'s SFT model) in a results folder of its own:

- ``full``: the embedded default (full fine-tuning, ``grpo.lr`` as config.yaml);
- ``lora-r<R>`` per ``--ranks``: ``grpo.lora`` on every linear layer at rank R (alpha 32), at
  ``--lr-scale`` times the default ``grpo.lr`` ("LoRA Without Regret": ~10x full fine-tuning's).

Per seed the full arm runs first (its RL-pool scoring and selection are the seed's); the LoRA arms
of that seed start from a copy of its ``filter/`` outputs, mtimes kept, so they train on the same
RL set without scoring it again (Snakemake finds the copies up to date), their order alternated
from seed to seed. Per arm: RL - SFT in avg@n points (``robustness.py --json``), the median GRPO
step time (``timing/step_s``), the GRPO job's peak resident memory (``max_rss`` of
``timings/grpo.tsv``: the trainer, with the colocated hf engine that shares its module), and the
bytes one policy version pushes: the merged weights (what the engine gets, full fine-tuning's and
LoRA's alike) beside the adapter alone (what a vLLM LoRA adapter per version would move).

``--sft-rank``: one more arm, SFT with LoRA at that rank and ``--lr-scale`` times ``sft.lr``
against the default run's SFT model (the pretrained model and data copied from it, so only SFT and
its evaluation run), at the config's seed: avg@n per benchmark of both.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ROBUSTNESS = ROOT / "benchmarks" / "robustness.py"


def default_config() -> dict:
    return yaml.safe_load((ROOT / "config.yaml").read_text())


def grpo_arms(ranks: list[int], lr_scale: float) -> dict[str, dict]:
    lr = default_config()["grpo"]["lr"]
    arms = {"full": {}}
    for rank in ranks:
        arms[f"lora-r{rank}"] = {"grpo": {"lr": lr * lr_scale, "lora": {"enabled": True, "rank": rank, "alpha": 32}}}
    return arms


def push_bytes(model: Path, ranks: list[int]) -> dict[str, dict[str, int]]:
    """Bytes of one policy version: the merged weights and, per rank, the adapter alone."""
    sys.path.insert(0, str(ROOT / "src"))
    from agentrl.config import load_config
    from agentrl.training.lora import hf_weights
    from agentrl.training.model import load_causal_lm

    plain = load_causal_lm(model)
    out = {"full": {"merged": sum(t.numel() * t.element_size() for _, t in hf_weights(plain))}}
    for rank in ranks:
        lora = load_config({"grpo": {"lora": {"enabled": True, "rank": rank}}}).grpo.lora
        policy = load_causal_lm(model, lora=lora)
        merged = sum(t.numel() * t.element_size() for _, t in hf_weights(policy))
        adapter = sum(p.numel() * p.element_size() for p in policy.parameters() if p.requires_grad)
        out[f"lora-r{rank}"] = {"merged": merged, "adapter": adapter}
    return out


def run_rl_arm(name: str, seed: int, args, overlay: Path, filter_from: Path | None) -> dict:
    """One robustness.py RL arm (its filter outputs copied from ``filter_from`` when given)."""
    out = args.out_dir / name
    folder = out / f"rl-s{seed}"
    if filter_from is not None and not (folder / "filter").exists():
        shutil.copytree(filter_from / "filter", folder / "filter", copy_function=shutil.copy2)
    report = out / f"robustness-s{seed}.json"
    command = [sys.executable, str(ROBUSTNESS), "--seeds", "--rl-seeds", str(seed)]
    command += ["--default-run", str(args.default_run), "--config-overlay", str(overlay)]
    command += ["--out-dir", str(out), "--json", str(report), "--cores", str(args.cores)]
    load_before = os.getloadavg()[0]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} seed {seed}: robustness.py failed\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (folder / "rl" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "timing/step_s" in r]
    with open(folder / "timings" / "grpo.tsv") as handle:
        timing = next(csv.DictReader(handle, delimiter="\t"))
    rl_row = next(r for r in json.loads(report.read_text())["rows"] if r["kind"] == "rl")
    return {
        "rl_minus_sft": rl_row["delta"],
        "rl_mean": rl_row["mean"],
        "step_s_median": statistics.median(r["timing/step_s"] for r in steps),
        "update_s_median": statistics.median(r["timing/update_s"] for r in steps),
        "weight_sync_s_median": statistics.median(r["timing/weight_sync_s"] for r in steps),
        "grpo_job_s": float(timing["s"]),
        "grpo_max_rss_mb": float(timing["max_rss"]),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "folder": str(folder),
    }


def run_sft_arm(args, overlay: Path) -> dict:
    """SFT with LoRA at the config's seed from the default run's pretrained model; its avg@n."""
    seed = int(default_config()["seed"])
    out = args.out_dir / f"sft-lora-r{args.sft_rank}"
    folder = out / f"sft-s{seed}-t2"
    for part in ("data", "models/base", "models/pretrained", "pretrain/metrics.jsonl"):  # the pretrain rule's outputs
        src, dst = args.default_run / part, folder / part
        if dst.exists() or not src.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, copy_function=shutil.copy2)
        else:
            shutil.copy2(src, dst)
    report = out / "robustness.json"
    command = [sys.executable, str(ROBUSTNESS), "--seeds", str(seed), "--threads", "2", "--rl-seeds"]
    command += [
        "--config-overlay",
        str(overlay),
        "--out-dir",
        str(out),
        "--json",
        str(report),
        "--cores",
        str(args.cores),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"sft arm: robustness.py failed\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    lora = next(r for r in json.loads(report.read_text())["rows"] if r["kind"] == "sft")
    full = {}
    for bench in lora["avg"]:
        metrics = json.loads((args.default_run / "eval" / "sft" / bench / "metrics.json").read_text())
        full[bench] = next(v for k, v in metrics.items() if k.startswith("avg@")) * 100
    return {"lora": lora["avg"], "lora_mean": lora["mean"], "full": full, "full_mean": statistics.fmean(full.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--default-run", type=Path, required=True, help="a results folder with its SFT model evaluated")
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--lr-scale", type=float, default=10.0, help="LoRA lr / full fine-tuning lr (default 10)")
    parser.add_argument("--sft-rank", type=int, help="also SFT with LoRA at this rank against the default SFT")
    parser.add_argument("--out-dir", type=Path, default=Path("results/lora"))
    parser.add_argument("--cores", default="all")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    arms = grpo_arms(args.ranks, args.lr_scale)
    summary: dict = {
        "command": " ".join(sys.argv),
        "push_bytes": push_bytes(args.default_run / "models" / "sft", args.ranks),
    }
    print(json.dumps(summary["push_bytes"]), flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        overlays = {name: Path(folder) / f"{name}.yaml" for name in arms}
        for name, overlay in arms.items():
            overlays[name].write_text(json.dumps(overlay))  # JSON is YAML
        for index, seed in enumerate(args.seeds):
            row = {"seed": seed, "full": run_rl_arm("full", seed, args, overlays["full"], None)}
            lora_arms = [name for name in arms if name != "full"]
            for name in lora_arms if index % 2 == 0 else reversed(lora_arms):
                row[name] = run_rl_arm(name, seed, args, overlays[name], Path(row["full"]["folder"]))
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.sft_rank:
            scale = args.lr_scale * default_config()["sft"]["lr"]
            sft_overlay = Path(folder) / "sft.yaml"
            sft_overlay.write_text(json.dumps({"sft": {"lr": scale, "lora": {"enabled": True, "rank": args.sft_rank}}}))
            summary["sft"] = run_sft_arm(args, sft_overlay)
            print(json.dumps(summary["sft"]), flush=True)
    summary["grpo"] = {}
    for name in arms:
        gains = [r[name]["rl_minus_sft"] for r in rows]
        summary["grpo"][name] = {
            "rl_minus_sft": gains,
            "rl_minus_sft_mean": statistics.fmean(gains) if gains else None,
            "step_s_median": statistics.median(r[name]["step_s_median"] for r in rows) if rows else None,
            "grpo_max_rss_mb_median": statistics.median(r[name]["grpo_max_rss_mb"] for r in rows) if rows else None,
        }
    full_gain = summary["grpo"]["full"]["rl_minus_sft_mean"]
    for arm in summary["grpo"].values():
        arm["share_of_full_gain"] = arm["rl_minus_sft_mean"] / full_gain if full_gain else None
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({**summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
