"""Sharded scoring of the embedded RL pool: wall time of filter.shards N against 1, and the pass rates (not a test).

Workflow arm: the pool is scored through Snakemake (rules/filter.smk: the shard jobs and the
gather) once with ``filter.shards: 1`` and once with ``filter.shards: N`` under
``snakemake --cores C``, each in a fresh folder; prints both wall times, their ratio, the load
average, and whether the two pass-rate tables are byte-identical (they must be).

Sampling arm (``--overhead``): the hf engine's per-sequence seeds (one ``random.Random`` per row,
inverse-CDF sampling) against unseeded ``torch.multinomial`` on the same prompts, interleaved
pairs, medians and their ratio: the cost of making each sample independent of its batch.

    python benchmarks/shards.py --shards 2 --cores 2 --json results/timings/shards_bench.json
    python benchmarks/shards.py --model results/models/sft   # score with the trained SFT model

Without ``--model`` the embedded base model (untrained, built here) scores: it rambles to the
response budget, so keep the budget small on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=2, help="filter.shards of the sharded arm (default 2)")
    parser.add_argument("--cores", type=int, default=2, help="snakemake --cores (default 2)")
    parser.add_argument("--model", type=Path, help="scoring model folder (default: build the embedded base model)")
    parser.add_argument(
        "--rl-pool-per-family", type=int, default=192, help="pool size per family (default: the embedded default's)"
    )
    parser.add_argument("--k", type=int, default=8, help="filter.k (default 8)")
    parser.add_argument("--max-response-tokens", type=int, default=512)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--overhead", action="store_true", help="only the sampling arm")
    parser.add_argument("--pairs", type=int, default=5, help="sampling arm: interleaved pairs (default 5)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    return parser


def _run(command: list, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env, **kwargs)
    if done.returncode != 0:
        sys.exit(f"{' '.join(map(str, command))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def _inputs(root: Path, args) -> Path:
    """results/data/rl_pool.parquet and results/models/sft under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "data.yaml"
    embedded = {
        "rl_pool_per_family": args.rl_pool_per_family,
        "sft_per_family": 8,
        "eval_per_family": 4,
    }  # only the pool is scored
    config.write_text(json.dumps({"data": {"embedded": embedded}}))
    data = root / "results/data"
    cli = [sys.executable, "-m", "agentrl"]
    _run(
        [
            *cli,
            "prepare-data",
            "--config",
            config,
            "--sft",
            data / "sft.parquet",
            "--rl-pool",
            data / "rl_pool.parquet",
            "--eval-dir",
            data / "eval",
        ]
    )
    if args.model:
        shutil.copytree(args.model, root / "results/models/sft")
    else:
        _run(
            [
                *cli,
                "base-model",
                "--config",
                config,
                "--sft",
                data / "sft.parquet",
                "--rl-pool",
                data / "rl_pool.parquet",
                "--out",
                root / "results/models/sft",
            ]
        )
    return root / "results"


def _score(results: Path, workdir: Path, shards: int, args) -> float:
    shutil.copytree(results, workdir / "results")
    (workdir / "Snakefile").write_text(
        f'configfile: "{ROOT}/config.yaml"\ninclude: "{ROOT}/rules/common.smk"\ninclude: "{ROOT}/rules/filter.smk"\n'
    )
    budget = args.max_response_tokens
    overrides = {
        "filter": {"k": args.k, "shards": shards},
        "rollout": {"max_response_tokens": budget, "max_turns": args.max_turns},
        "reward": {"overlong": {"max_response_length": budget, "buffer_length": min(budget // 4, 1024)}},
    }
    (workdir / "bench.yaml").write_text(json.dumps(overrides))
    time.sleep(1.1)  # outputs newer than inputs at the file system's time resolution
    started = time.perf_counter()
    command = [sys.executable, "-m", "snakemake", "--cores", args.cores, "-s", workdir / "Snakefile"]
    _run(
        [*command, "--directory", workdir, "results/filter/pass_rates.parquet", "--configfile", workdir / "bench.yaml"]
    )
    return time.perf_counter() - started


def workflow_arm(args) -> dict:
    import pandas as pd

    with tempfile.TemporaryDirectory(prefix="agentrl-shards-bench-") as tmp:
        tmp = Path(tmp)
        results = _inputs(tmp / "inputs", args)
        load_before = os.getloadavg()
        one = _score(results, tmp / "one", 1, args)
        many = _score(results, tmp / "many", args.shards, args)
        tables = [pd.read_parquet(tmp / arm / "results/filter/pass_rates.parquet") for arm in ("one", "many")]
        identical = all(
            (tmp / "one/results/filter" / f).read_bytes() == (tmp / "many/results/filter" / f).read_bytes()
            for f in ("pass_rates.parquet", "samples.jsonl")
        )
        problems = len(tables[0])
    return {
        "problems": problems,
        "k": args.k,
        "cores": args.cores,
        "shards": args.shards,
        "wall_s_shards_1": round(one, 1),
        f"wall_s_shards_{args.shards}": round(many, 1),
        "ratio_sharded_over_one": round(many / one, 3),
        "mean_pass_rate": [round(float(t["pass_rate"].mean()), 4) for t in tables],
        "byte_identical": identical,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def sampling_arm(args) -> dict:
    """Seeded (per-row) against unseeded generation of the same prompts with the embedded model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.rollout import SamplingParams
    from agentrl.rollout.hf_engine import HFEngine

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="agentrl-sampling-bench-") as tmp:
        model_dir = args.model or _inputs(Path(tmp), argparse.Namespace(**{**vars(args), "model": None})) / "models/sft"
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode(f"Compute {i} * {i + 7} and explain.") for i in range(64)]
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id or 0, batch_size=64)
    params = SamplingParams(temperature=1.0, max_tokens=128)
    times: dict[str, list[float]] = {"per_row_seeds": [], "unseeded_multinomial": []}
    engine.generate(prompts[:4], params)  # warm-up
    arms = [("per_row_seeds", list(range(64))), ("unseeded_multinomial", None)]
    for pair in range(args.pairs):
        for arm, seeds in arms[:: 1 if pair % 2 else -1]:  # alternate the order: drift in the load cancels
            started = time.perf_counter()
            engine.generate(prompts, params, seeds=seeds)
            times[arm].append(time.perf_counter() - started)
    medians = {arm: statistics.median(values) for arm, values in times.items()}
    return {
        "sequences": 64,
        "tokens_per_sequence": 128,
        "median_s": {arm: round(value, 3) for arm, value in medians.items()},
        "all_s": {arm: [round(v, 3) for v in values] for arm, values in times.items()},
        "ratio_per_row_over_multinomial": round(medians["per_row_seeds"] / medians["unseeded_multinomial"], 3),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    args = _parser().parse_args()
    figures = {"sampling": sampling_arm(args)}
    if not args.overhead:
        figures["workflow"] = workflow_arm(args)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
