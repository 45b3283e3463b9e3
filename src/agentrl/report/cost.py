"""What each stage cost: wall time, CPU- and GPU-hours, tokens, tokens/s, and training MFU.

Rows are rules, from Snakemake's benchmark files (``results/timings/<rule>.tsv``, or
``results/timings/<rule>/<wildcards>.tsv`` per job; columns ``s`` = wall seconds, ``cpu_time`` =
user + system CPU seconds of the job's processes, ``max_rss`` in MB) and the stages' own outputs
for the tokens:

- ``sft`` and ``pretrain`` (the embedded model's copying pretraining, SFT's trainer): trained
  tokens = the tokens through the forward and backward passes (no padding),
  ``tokens_per_s x step_time_s`` summed over ``results/{sft,pretrain}/metrics.jsonl``;
- ``grpo``: generated tokens = ``rollout/generated_tokens_mean x rollout/trajectories`` and
  trained tokens = ``actor/input_tokens`` (prompt + response through the update, all epochs),
  summed over the steps of ``results/rl/metrics.jsonl``;
- ``score_rl_pool`` and ``evaluate``: generated tokens = the ``response_tokens`` of every row
  of the scoring and evaluation ``samples.jsonl`` files.

``tokens_per_s`` = (generated + trained) / the rule's summed wall time. ``gpu_h`` = wall time x the
rule's ``gpu`` resource per job (0 on a CPU run). ``mfu_pct`` for the training stages: model
FLOPs ``6 N T_trained + 2 N T_generated`` (N parameters, from the model's safetensors headers;
the usual dense-transformer count without attention's quadratic term) per wall second, over the
peak: on GPUs ``gpu x`` the device's dense bf16 peak from :data:`PEAK_TFLOPS` (``--accelerator``
names the device; without it the figure is omitted and the note says so); on a CPU run the
float32 matmul peak measured on this machine with the rule's threads (:func:`measured_matmul_tflops`;
the report job runs where a local run trained). Both are upper bounds of what the stage could
do, so MFU is a lower bound of how well it used the device, with everything else in the wall
time (rollouts, tools, checkpoints) counted against it.

The report job writes the table, so its own time is not in it (its file is written after it). A
timing file left by a job of an earlier configuration (another shard count) is listed too:
delete ``results/timings/`` before a run whose cost table should hold only its own jobs.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from agentrl.errors import DataFormatError, UserInputError
from agentrl.sampling.samples import read_jsonl  # streamed: the scoring samples of a paper run are gigabytes

# Dense (no sparsity) bf16 tensor-core peaks per device, TFLOP/s, from NVIDIA's data sheets.
PEAK_TFLOPS = {
    "A100": 312.0,  # A100 SXM / PCIe 80GB
    "H100": 989.0,  # H100 SXM (PCIe: 756)
    "H100-PCIE": 756.0,
    "H200": 989.0,
    "L40S": 362.0,
    "B200": 2250.0,
}
TRAINING_RULES = ("pretrain", "sft", "grpo")
COLUMNS = (
    "rule",
    "jobs",
    "wall_s",
    "cpu_h",
    "gpus_per_job",
    "gpu_h",
    "max_rss_mb",
    "generated_tokens",
    "trained_tokens",
    "tokens_per_s",
    "mfu_pct",
    "staleness_mean",
    "note",
)


def rule_of(timing: Path, root: Path) -> str:
    """The rule a benchmark file belongs to: its first folder (or stem) under ``root``; the
    ablations' jobs keep their stage's name after ``ablations/``."""
    parts = timing.relative_to(root).with_suffix("").parts
    if parts[0] == "ablations" and len(parts) > 1:
        stage = next((p for p in parts[1:] if p in ("grpo", "evaluate", "stitched_sft", "stitched_data")), parts[-1])
        return f"ablations/{stage}"
    return parts[0]


def read_benchmark(path: Path) -> dict[str, float]:
    """Wall seconds, CPU seconds and peak RSS (MB) of one job's benchmark file (its last line)."""
    try:
        frame = pd.read_csv(path, sep="\t")
    except Exception as exc:  # noqa: BLE001 - pandas raises many kinds for a damaged file
        raise DataFormatError(f"{path}: not a Snakemake benchmark file ({type(exc).__name__}: {exc})") from None
    missing = [c for c in ("s", "cpu_time", "max_rss") if c not in frame.columns]
    if missing or frame.empty:
        raise DataFormatError(f"{path}: not a Snakemake benchmark file (columns {list(frame.columns)})")
    last = frame.iloc[-1]
    number = lambda key: float(pd.to_numeric(last[key], errors="coerce"))  # noqa: E731 - "NA" where unmeasured
    return {"wall_s": number("s"), "cpu_s": number("cpu_time"), "max_rss_mb": number("max_rss")}


def sft_tokens(path: Path) -> dict[str, float]:
    trained = sum(float(r["tokens_per_s"]) * float(r["step_time_s"]) for r in read_jsonl(path) if "tokens_per_s" in r)
    return {"generated_tokens": 0.0, "trained_tokens": trained}


def grpo_tokens(path: Path) -> dict[str, float]:
    """The tokens of the GRPO steps, and how stale their rollouts were on average (policy versions
    behind the update, ``rollout/staleness``; 0 for a synchronous run, which logs none)."""
    generated = trained = 0.0
    staleness = []
    for row in read_jsonl(path):
        if "actor/input_tokens" in row:
            generated += float(row["rollout/generated_tokens_mean"]) * float(row["rollout/trajectories"])
            trained += float(row["actor/input_tokens"])
            staleness.append(float(row.get("rollout/staleness", 0.0)))
    return {
        "generated_tokens": generated,
        "trained_tokens": trained,
        "staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
    }


def samples_tokens(paths: Sequence[Path]) -> dict[str, float]:
    generated = sum(float(row["response_tokens"]) for path in paths for row in read_jsonl(path))
    return {"generated_tokens": generated, "trained_tokens": 0.0}


def parameter_count(model_dir: Path) -> int:
    """Parameters of a Hugging Face folder, from its safetensors headers (nothing is loaded)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise DataFormatError(f"{model_dir}: no *.safetensors file to count the parameters of")
    total = 0
    for path in files:
        with open(path, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


_SINGLE_THREAD_MATMUL = """
import time, numpy as np
a, b = np.random.rand(1024, 1024).astype(np.float32), np.random.rand(1024, 1024).astype(np.float32)
a @ b
best, deadline = 0.0, time.perf_counter() + {seconds}
while time.perf_counter() < deadline:
    started = time.perf_counter()
    a @ b
    best = max(best, 2 * 1024 ** 3 / (time.perf_counter() - started))
print(best)
"""


@functools.cache
def single_thread_matmul_tflops(seconds: float = 1.0) -> float:
    """float32 matmul TFLOP/s of one thread of this machine (numpy's BLAS held to one thread in a
    child process: the BLAS reads its thread count when it loads)."""
    one_thread = {key: "1" for key in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-c", _SINGLE_THREAD_MATMUL.format(seconds=seconds)],
        env={**os.environ, **one_thread},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return float(done.stdout.strip()) / 1e12


def measured_matmul_tflops(threads: int) -> float:
    """The CPU peak a job of ``threads`` threads is measured against: ``threads`` x the measured
    single-thread float32 matmul peak (an upper bound: threads scale at best linearly)."""
    return max(1, threads) * single_thread_matmul_tflops()


def cost_frame(
    timings_dir: Path,
    tokens: Mapping[str, Mapping[str, float]],
    gpus: Mapping[str, int],
    threads: Mapping[str, int],
    parameters: Mapping[str, int],
    accelerator: str | None = None,
    cpu_peak=measured_matmul_tflops,
) -> pd.DataFrame:
    """One row per rule with a benchmark file under ``timings_dir``, then the total."""
    files = sorted(timings_dir.rglob("*.tsv"))
    if not files:
        raise DataFormatError(f"{timings_dir}: no benchmark file (*.tsv); did the workflow run here?")
    by_rule: dict[str, list[dict[str, float]]] = {}
    for path in files:
        rule = rule_of(path, timings_dir)
        if rule != "report":  # the job writing this table: its file is written after it
            by_rule.setdefault(rule, []).append(read_benchmark(path))
    rows = []
    for rule, jobs in by_rule.items():
        wall = sum(j["wall_s"] for j in jobs)
        counts = tokens.get(rule, {})
        generated, trained = counts.get("generated_tokens"), counts.get("trained_tokens")
        moved = (generated or 0.0) + (trained or 0.0)
        per_job = int(gpus.get(rule, 0))
        mfu, note = None, ""
        if rule in TRAINING_RULES and rule in parameters and trained:
            flops = 6 * parameters[rule] * trained + 2 * parameters[rule] * (generated or 0.0)
            if per_job == 0:
                peak = cpu_peak(threads.get(rule, 1))
                note = (
                    f"MFU against {threads.get(rule, 1)} threads x this machine's measured float32 matmul "
                    f"peak of one thread ({peak:.3f} TFLOP/s)"
                )
            elif accelerator is not None:
                peak = per_job * PEAK_TFLOPS[accelerator]
                note = f"MFU against {per_job} x {accelerator} ({PEAK_TFLOPS[accelerator]:.0f} TFLOP/s bf16 dense each)"
            else:
                peak, note = None, "MFU omitted: the GPU model is not known (give --accelerator)"
            mfu = None if peak is None else 100.0 * flops / wall / (peak * 1e12)
        rows.append(
            {
                "rule": rule,
                "jobs": len(jobs),
                "wall_s": wall,
                "cpu_h": sum(j["cpu_s"] for j in jobs) / 3600,
                "gpus_per_job": per_job,
                "gpu_h": wall * per_job / 3600,
                "max_rss_mb": max(j["max_rss_mb"] for j in jobs),
                "generated_tokens": generated,
                "trained_tokens": trained,
                "tokens_per_s": moved / wall if counts and wall > 0 else None,
                "mfu_pct": mfu,
                "staleness_mean": counts.get("staleness_mean"),
                "note": note,
            }
        )
    frame = pd.DataFrame.from_records(rows, columns=list(COLUMNS))
    total = {
        "rule": "total",
        "jobs": int(frame["jobs"].sum()),
        "wall_s": float(frame["wall_s"].sum()),
        "cpu_h": float(frame["cpu_h"].sum()),
        "gpu_h": float(frame["gpu_h"].sum()),
        "max_rss_mb": float(frame["max_rss_mb"].max()),
        "note": "sums over the jobs (they may have run in parallel)",
    }
    return pd.concat([frame, pd.DataFrame([total], columns=list(COLUMNS))], ignore_index=True)


def cost_markdown(frame: pd.DataFrame) -> str:
    def cell(value: Any, digits: int) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)

    header = (
        "| rule | jobs | wall s | CPU-h | GPUs / job | GPU-h | max RSS MB | generated tokens | trained tokens "
        "| tokens/s | MFU % | staleness | note |"
    )
    lines = ["# Cost of every stage", "", header, "|" + "---|" * 13]
    for row in frame.to_dict("records"):
        cells = [row["rule"], cell(row["jobs"], 0), cell(row["wall_s"], 1), cell(row["cpu_h"], 4)]
        cells += [cell(row["gpus_per_job"], 0), cell(row["gpu_h"], 4), cell(row["max_rss_mb"], 0)]
        cells += [cell(row["generated_tokens"], 0), cell(row["trained_tokens"], 0), cell(row["tokens_per_s"], 1)]
        cells += [cell(row["mfu_pct"], 3), cell(row["staleness_mean"], 2)]
        cells += [row["note"] if isinstance(row["note"], str) else ""]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += [
        "",
        "From Snakemake's benchmark files (results/timings/) and the stages' outputs "
        "(src/agentrl/report/cost.py says how each figure is computed). Wall time is summed over a "
        "rule's jobs; tokens/s divides the generated and trained tokens by it. Staleness: how many "
        "policy versions GRPO's rollouts lagged the update on average (grpo.max_staleness; 0 on-policy).",
    ]
    return "\n".join(lines) + "\n"


def _pairs(values: Sequence[str], flag: str) -> dict[str, int]:
    out = {}
    for pair in values:
        rule, sep, number = pair.partition("=")
        if not sep or not rule or not number.isdigit():
            raise UserInputError(f"{flag} {pair!r}: expected RULE=N")
        out[rule] = int(number)
    return out


def main(argv: list[str]) -> int:
    """``python -m agentrl report cost``: cost.md and cost.csv of a run's stages."""
    from agentrl.paths import check_writable
    from agentrl.stage_cli import setup_logging, stage_parser

    parser = stage_parser("report cost", __doc__)
    parser.add_argument("--timings", type=Path, required=True, help="the benchmark folder (results/timings)")
    parser.add_argument("--pretrain-metrics", type=Path, help="results/pretrain/metrics.jsonl (its trained tokens)")
    parser.add_argument("--pretrain-model", type=Path, help="the pretrained model folder (its parameter count)")
    parser.add_argument("--sft-metrics", type=Path, help="results/sft/metrics.jsonl (SFT's trained tokens)")
    parser.add_argument("--rl-metrics", type=Path, help="results/rl/metrics.jsonl (GRPO's tokens)")
    parser.add_argument("--sft-model", type=Path, help="the SFT model folder (its parameter count, for MFU)")
    parser.add_argument("--rl-model", type=Path, help="the RL model folder (its parameter count, for MFU)")
    parser.add_argument("--scoring-samples", type=Path, nargs="*", default=[], help="the scoring samples.jsonl")
    parser.add_argument("--eval-samples", type=Path, nargs="*", default=[], help="every evaluation samples.jsonl")
    parser.add_argument("--gpus", action="append", default=[], metavar="RULE=N", help="a rule's GPUs per job")
    parser.add_argument("--threads", action="append", default=[], metavar="RULE=N", help="a rule's CPU threads")
    parser.add_argument("--accelerator", choices=sorted(PEAK_TFLOPS), help="the GPU model, for MFU on GPUs")
    parser.add_argument("--md", type=Path, required=True, help="output: cost.md")
    parser.add_argument("--csv", type=Path, required=True, help="output: cost.csv")
    args = parser.parse_args(argv)
    setup_logging()
    check_writable((args.md, "--md"), (args.csv, "--csv"))
    tokens: dict[str, dict[str, float]] = {}
    if args.pretrain_metrics is not None:
        tokens["pretrain"] = sft_tokens(args.pretrain_metrics)
    if args.sft_metrics is not None:
        tokens["sft"] = sft_tokens(args.sft_metrics)
    if args.rl_metrics is not None:
        tokens["grpo"] = grpo_tokens(args.rl_metrics)
    if args.scoring_samples:
        tokens["score_rl_pool"] = samples_tokens(args.scoring_samples)
    if args.eval_samples:
        tokens["evaluate"] = samples_tokens(args.eval_samples)
    parameters = {}
    for rule, folder in (("pretrain", args.pretrain_model), ("sft", args.sft_model), ("grpo", args.rl_model)):
        if folder is not None:
            parameters[rule] = parameter_count(folder)
    gpus, threads = _pairs(args.gpus, "--gpus"), _pairs(args.threads, "--threads")
    frame = cost_frame(args.timings, tokens, gpus, threads, parameters, args.accelerator)
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(cost_markdown(frame), encoding="utf-8")
    frame.to_csv(args.csv, index=False)
    return 0
