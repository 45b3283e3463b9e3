"""GPU check: SFT steps and GRPO steps of a ~0.5 B-parameter Qwen3 in bf16 on DeepSpeed, with tokens/s and MFU.

    benchmarks/gpu_check.sh [summary.json]          # the entry point (checks the GPU first)
    python benchmarks/gpu_check.py [summary.json] [--sft-steps 20 --grpo-steps 2 --size 0.5b]

Runs the project's real stage CLIs one after the other, on one CUDA GPU and without network:

1. ``python -m agentrl prepare-data``: the embedded task, with the recipe's verbatim prompts
   (``prompt_style: paper``, ~700-token conversations).
2. ``python -m agentrl base-model``: the embedded tokenizer and a randomly initialised Qwen3 of
   Qwen3-0.6B's shape (hidden 1024, 28 layers, 16 query / 8 key-value heads of 128, MLP 3072):
   about 0.44 B parameters, since the embedded tokenizer's vocabulary is ~1 k tokens, not 152 k.
3. ``python -m agentrl sft``: ``--sft-steps`` steps, DeepSpeed ZeRO-2, bf16.
4. ``python -m agentrl grpo``: ``--grpo-steps`` steps of GRPO-TCR from the SFT model, the ``hf``
   rollout engine in bf16 (sharing the DeepSpeed module), DeepSpeed ZeRO-2 in bf16.
5. the same GRPO run one step off (``grpo.max_staleness: 1``, placement separate): a rollout
   process with its own hf engine on the same GPU, each policy version pushed through vLLM's
   weight-transfer protocol on the ``agentrl_gloo`` backend (NCCL connects no two processes on
   one device, so vLLM's own backend needs a second GPU); staleness, push and step seconds.
6. the same GRPO run with LoRA (``grpo.lora``: rank 8 on every linear layer of the blocks, 10x
   the learning rate, presets/one-gpu.yaml's setting): only the adapter trains, the hf engine
   samples with the adapted module; update tokens/s and step seconds beside the full run's, and
   the adapter's share of the parameters (its ``adapter/`` folder beside the merged export).

The figures come from the stages' own ``metrics.jsonl`` files:

- SFT: tokens/s = real (unpadded) tokens / step time, summed over the steady steps (the first
  ``--warmup-steps`` pay for CUDA kernel selection and allocator growth and are left out).
- GRPO: training tokens/s = prompt + response tokens through forward and backward / update time
  (``actor/input_tokens`` / ``timing/update_s``), rollout tokens/s = model-generated tokens /
  generation time; the last step is the steady one (the first pays for warm-up).
- MFU = 6 x parameters x tokens / seconds / peak bf16 FLOP/s. The peak is ``GPU_CHECK_PEAK_FLOPS``
  or, by default, 989e12 (H100 / H200 SXM, dense bf16). 6N counts the matmuls of forward (2N) and
  backward (4N); a tied embedding counts once, standing for the LM-head matmul. Attention scores
  (up to 12 x layers x context x heads x head_dim per token: 10-30 % more at these lengths) are
  left out, so the MFU is an underestimate, comparable with other 6N figures.

The summary JSON goes to the given path, else ``$OUT/gpu_check.json``, with the stage logs and
metrics files beside it (``gpu_check_logs/``); a failed check writes its error into the summary.
Without a CUDA GPU the script stops with an error, unless ``GPU_CHECK_ALLOW_CPU=1`` (then
``--size tiny`` runs every path except CUDA in about two minutes on a CPU). Time: part 1 of
benchmarks/gpu_check.sh (one call, 260-s cap). ``--time-limit-s`` defaults to the cap less 15 s, so
the summary names the stage past it; a SIGTERM kills the running stage's session. The 0.5b size
runs 20 SFT steps and GRPO responses of at most 256 tokens (were 40 and 512, about 4 minutes on an
H100 by the stages' step times): about 3 minutes, an estimate until a GPU runs it.
Not a test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PEAK_FLOPS = 989e12  # H100 / H200 SXM, dense bf16 tensor cores (NVIDIA datasheet, no sparsity)
FAMILIES = 3  # the embedded task's families (arith, choice, program)

# Model shapes (config keys of model.embedded) and the run sizes that go with them.
SIZES: dict[str, dict[str, Any]] = {
    "0.5b": {  # Qwen3-0.6B's shape; the BPE stops at ~1 k tokens on the embedded corpus (Qwen3: 152 k)
        "model": {
            "vocab_size": 32768,
            "hidden_size": 1024,
            "num_layers": 28,
            "num_heads": 16,
            "num_kv_heads": 8,
            "head_dim": 128,
            "intermediate_size": 3072,
            "max_position_embeddings": 4096,
        },
        "sft": {"global_batch_size": 32, "micro_batch_size": 16, "max_length": 2048, "lr": 1e-4},
        "grpo": {"batch_prompts": 16, "n": 8, "max_response_tokens": 256, "rollout_batch": 128},
        "sft_steps": 20,
        "warmup_steps": 4,
    },
    "tiny": {  # every code path in about a minute on a CPU
        "model": {
            "vocab_size": 512,
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 4,
            "num_kv_heads": 2,
            "head_dim": 16,
            "intermediate_size": 128,
            "max_position_embeddings": 4096,
        },
        "sft": {"global_batch_size": 8, "micro_batch_size": 4, "max_length": 2048, "lr": 3e-3},
        "grpo": {"batch_prompts": 2, "n": 2, "max_response_tokens": 32, "rollout_batch": 4},
        "sft_steps": 4,
        "warmup_steps": 1,
    },
}


# --------------------------------------------------------------------------- arithmetic
def training_flops(parameters: int, tokens: float) -> float:
    """Forward + backward matmul FLOPs: ``6 N T`` (2 N per token forward, 4 N backward)."""
    return 6.0 * parameters * tokens


def model_flops_utilisation(parameters: int, tokens: float, seconds: float, peak_flops: float) -> float:
    """MFU = ``6 N T / seconds / peak``: the share of the chip's peak spent on the model's matmuls."""
    if seconds <= 0 or peak_flops <= 0:
        raise ValueError(f"MFU needs positive seconds and peak FLOP/s (got {seconds}, {peak_flops})")
    return training_flops(parameters, tokens) / seconds / peak_flops


def peak_flops_from_env(env: Mapping[str, str]) -> tuple[float, str]:
    """(peak bf16 FLOP/s, where it comes from): ``GPU_CHECK_PEAK_FLOPS`` or the H100/H200 default."""
    raw = env.get("GPU_CHECK_PEAK_FLOPS")
    if not raw:
        return (
            DEFAULT_PEAK_FLOPS,
            "default: 989e12, H100/H200 SXM dense bf16 (set GPU_CHECK_PEAK_FLOPS for other chips)",
        )
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"GPU_CHECK_PEAK_FLOPS={raw!r} is not a number (e.g. 989e12)") from None
    if not value > 0:
        raise ValueError(f"GPU_CHECK_PEAK_FLOPS={raw!r} must be > 0")
    return value, f"GPU_CHECK_PEAK_FLOPS={raw}"


def safetensors_parameter_count(model_dir: Path) -> int:
    """Parameters stored in a folder's ``*.safetensors`` files, read from their headers only.

    Tied weights are stored once, as ``model.parameters()`` counts them.
    """
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no .safetensors file to count parameters in")
    total = 0
    for path in files:
        with open(path, "rb") as fh:
            (header_len,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(header_len))
        total += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return total


def sft_throughput(
    records: Sequence[Mapping[str, Any]], parameters: int, peak_flops: float, warmup_steps: int
) -> dict[str, Any]:
    """Tokens/s and MFU of the SFT steps after the first ``warmup_steps`` (real tokens, not padding)."""
    steady = [r for r in records if r["step"] > warmup_steps]
    if not steady:
        raise ValueError(f"no SFT step after the {warmup_steps} warm-up steps ({len(records)} steps in all)")
    tokens = sum(r["tokens_per_s"] * r["step_time_s"] for r in steady)
    seconds = sum(r["step_time_s"] for r in steady)
    return {
        "steps": len(records),
        "steady_steps": len(steady),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "mfu": model_flops_utilisation(parameters, tokens, seconds, peak_flops),
        "pad_fraction": sum(r["pad_fraction"] for r in steady) / len(steady),
        "loss_first": records[0]["loss"],
        "loss_last": records[-1]["loss"],
    }


def grpo_throughput(records: Sequence[Mapping[str, Any]], parameters: int, peak_flops: float) -> dict[str, Any]:
    """Per training step: update tokens/s and MFU, rollout tokens/s; the last step is the steady one."""
    steps = []
    for r in records:
        if "timing/update_s" not in r:  # a validation-only line (step 0)
            continue
        generated = r["rollout/generated_tokens_mean"] * r["rollout/trajectories"]
        steps.append(
            {
                "step": r["step"],
                "step_s": r["timing/step_s"],
                "update_s": r["timing/update_s"],
                "input_tokens": r["actor/input_tokens"],
                "train_tokens_per_s": r["actor/input_tokens"] / r["timing/update_s"],
                "mfu": model_flops_utilisation(parameters, r["actor/input_tokens"], r["timing/update_s"], peak_flops),
                "generate_s": r["timing/generate_s"],
                "generated_tokens": generated,
                "rollout_tokens_per_s": generated / r["timing/generate_s"] if r["timing/generate_s"] > 0 else None,
                "response_length_mean": r["rollout/response_length_mean"],
                "reward_mean": r["rollout/reward_mean"],
            }
        )
    if not steps:
        raise ValueError("the GRPO metrics hold no training step")
    last = steps[-1]
    return {
        "steps": steps,
        "train_tokens_per_s": last["train_tokens_per_s"],
        "mfu": last["mfu"],
        "rollout_tokens_per_s": last["rollout_tokens_per_s"],
    }


# --------------------------------------------------------------------------- stage configs
def sft_config(size: Mapping[str, Any], steps: int, examples: int, dtype: str) -> dict[str, Any]:
    """The ``sft`` section: ZeRO-2, no checkpoints, enough epochs for at least ``steps`` steps."""
    per_epoch = examples // size["sft"]["global_batch_size"]
    if per_epoch < 1:
        raise ValueError(f"{examples} SFT examples make no step of {size['sft']['global_batch_size']}")
    return {
        **size["sft"],
        "epochs": -(-steps // per_epoch),
        "warmup_ratio": 0.1,
        "save_every_steps": 0,
        "deepspeed": {"zero_stage": 2, "dtype": dtype, "gradient_checkpointing": False},
    }


def grpo_config(size: Mapping[str, Any], steps: int, dtype: str) -> dict[str, Any]:
    """``rollout``, ``reward`` and ``grpo`` sections: hf engine, one optimizer step per GRPO step."""
    g = size["grpo"]
    return {
        "rollout": {
            "engine": "hf",
            "dtype": dtype,
            "max_turns": 2,
            "max_prompt_tokens": 2048,
            "max_response_tokens": g["max_response_tokens"],
            "batch_size": g["rollout_batch"],
        },
        "reward": {
            "overlong": {
                "max_response_length": g["max_response_tokens"],
                "buffer_length": g["max_response_tokens"] // 4,
            }
        },
        "grpo": {
            "variant": "grpo_tcr",
            "max_steps": steps,
            "batch_prompts": g["batch_prompts"],
            "n": g["n"],
            "mini_batch_prompts": g["batch_prompts"],
            "lr": 1e-6,
            "test_freq": 0,
            "val_before_train": False,
            "save_freq": 0,
            "deepspeed": {"zero_stage": 2, "dtype": dtype, "gradient_checkpointing": False},
        },
    }


def lora_grpo_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with GRPO on LoRA adapters as presets/one-gpu.yaml trains them: rank 8 on every
    linear layer of the blocks, 10x the learning rate ("LoRA Without Regret")."""
    grpo = config["grpo"]
    return {**config, "grpo": {**grpo, "lora": {"enabled": True, "rank": 8, "alpha": 32}, "lr": 10 * grpo["lr"]}}


# --------------------------------------------------------------------------- running
class StageFailed(RuntimeError):
    pass


def run_stage(name: str, args: list[str], config: dict[str, Any], log_path: Path, deadline: float) -> float:
    """``python -m agentrl <name> --config-json ... args`` with its output in ``log_path``; wall seconds."""
    command = [sys.executable, "-m", "agentrl", name, "--config-json", json.dumps(config), *args]
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "TOKENIZERS_PARALLELISM": "false",
    }
    print(f"gpu_check: {name} ...", flush=True)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        # Own session: a timeout kills the stage with everything it started (sandbox workers).
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = process.wait(timeout=max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            kill_session(process)
            raise StageFailed(f"{name} ran past the time limit; see {log_path}") from None
        except BaseException:  # SIGTERM (the part's cap, see stop_on_sigterm) or Ctrl-C
            kill_session(process)
            raise
    wall = time.perf_counter() - started
    if code:
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-40:])
        raise StageFailed(f"{name} failed (exit {code}); last lines of {log_path}:\n{tail}")
    print(f"gpu_check: {name} done in {wall:.1f} s", flush=True)
    return wall


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL a stage started in its own session, with everything it started."""
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def stop_on_sigterm() -> None:
    """A SIGTERM (the part's cap) fails the check as the time limit does: the stage's session,
    which the signal does not reach, is killed and the summary records the error."""

    def stop(signum, frame):
        raise StageFailed("stopped by SIGTERM (the part's cap in benchmarks/gpu_check.sh)")

    signal.signal(signal.SIGTERM, stop)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rollout_threads() -> int:
    """Torch CPU threads of the GRPO process: ``OMP_NUM_THREADS`` when set (a shared CPU box), else up to 8."""
    return int(os.environ.get("OMP_NUM_THREADS") or min(os.cpu_count() or 1, 8))


def device_info() -> dict[str, Any]:
    import deepspeed
    import torch
    import transformers

    info = {
        "cuda": torch.cuda.is_available(),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "transformers": transformers.__version__,
        "cpus": os.cpu_count(),
    }
    if info["cuda"]:
        info.update(
            name=torch.cuda.get_device_name(0),
            cuda_version=torch.version.cuda,
            memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
            bf16_supported=torch.cuda.is_bf16_supported(),
        )
    return info


def default_time_limit(env: Mapping[str, str]) -> float:
    """``GPU_CHECK_TIME_LIMIT_S``, else 15 s under the part's cap (to write the summary), else 245."""
    if env.get("GPU_CHECK_TIME_LIMIT_S"):
        return float(env["GPU_CHECK_TIME_LIMIT_S"])
    if env.get("GPU_CHECK_PART_CAP_S"):
        return max(float(env["GPU_CHECK_PART_CAP_S"]) - 15, 5.0)
    return 245.0


def default_summary_path() -> Path:
    out = os.environ.get("OUT")
    if not out:
        raise SystemExit("gpu_check: give the summary path as an argument or set $OUT")
    return Path(out) / "gpu_check.json"


def run_stages(
    size: Mapping[str, Any],
    sft_steps: int,
    grpo_steps: int,
    workdir: Path,
    logs: Path,
    deadline: float,
    walls: dict[str, float],
) -> dict[str, Any]:
    """Data, base model, SFT, GRPO; their configs, the parameter count and both metrics files' records."""
    data, models = workdir / "data", workdir / "models"
    per_family = -(-sft_steps * size["sft"]["global_batch_size"] // FAMILIES)  # one epoch covers the steps
    per_family = min(per_family, 256)  # more epochs rather than minutes of data generation
    rl_per_family = -(-size["grpo"]["batch_prompts"] * grpo_steps // FAMILIES)
    walls["prepare_data"] = run_stage(
        "prepare-data",
        [
            "--sft",
            str(data / "sft.parquet"),
            "--rl-pool",
            str(data / "rl_pool.parquet"),
            "--eval-dir",
            str(data / "eval"),
        ],
        {
            "data": {
                "embedded": {
                    "sft_per_family": per_family,
                    "rl_pool_per_family": rl_per_family,
                    "eval_per_family": 1,
                    "prompt_style": "paper",
                }
            }
        },
        logs / "prepare_data.log",
        deadline,
    )
    walls["base_model"] = run_stage(
        "base-model",
        ["--sft", str(data / "sft.parquet"), "--rl-pool", str(data / "rl_pool.parquet"), "--out", str(models / "base")],
        {"model": {"embedded": size["model"]}},
        logs / "base_model.log",
        deadline,
    )
    sft_cfg = sft_config(size, sft_steps, per_family * FAMILIES, "bfloat16")
    walls["sft"] = run_stage(
        "sft",
        [
            "--model",
            str(models / "base"),
            "--data",
            str(data / "sft.parquet"),
            "--out",
            str(models / "sft"),
            "--metrics",
            str(logs / "sft_metrics.jsonl"),
            "--checkpoint-dir",
            str(workdir / "sft_checkpoints"),
            "--nproc",
            "1",
        ],
        {"sft": sft_cfg},
        logs / "sft.log",
        deadline,
    )
    if "ZeRO-2, torch.bfloat16" not in (logs / "sft.log").read_text(errors="replace"):
        raise StageFailed(f"the SFT log does not say 'ZeRO-2, torch.bfloat16'; see {logs / 'sft.log'}")
    grpo_cfg = grpo_config(size, grpo_steps, "bfloat16")
    # The same GRPO run twice: synchronous, then one step off (grpo.max_staleness 1: placement
    # separate): the rollout process's hf engine on the same GPU, each version pushed over the
    # agentrl_gloo backend of vLLM's weight-transfer protocol (NCCL connects no two processes on one
    # device).
    # Then with LoRA, as presets/one-gpu.yaml trains it.
    runs = {
        "grpo": grpo_cfg,
        "grpo_one_step_off": {**grpo_cfg, "grpo": {**grpo_cfg["grpo"], "max_staleness": 1}},
        "grpo_lora": lora_grpo_config(grpo_cfg),
    }
    for name, config in runs.items():
        walls[name] = run_stage(
            "grpo",
            [
                "--model",
                str(models / "sft"),
                "--train",
                str(data / "rl_pool.parquet"),
                "--out",
                str(models / name.replace("grpo", "rl")),
                "--metrics",
                str(logs / f"{name}_metrics.jsonl"),
                "--checkpoint-dir",
                str(workdir / f"{name}_checkpoints"),
                "--nproc",
                "1",
                "--threads",
                str(rollout_threads()),
            ],
            config,
            logs / f"{name}.log",
            deadline,
        )
    return {
        "parameters": safetensors_parameter_count(models / "base"),
        "sft_config": sft_cfg,
        "grpo_config": grpo_cfg,
        "sft_records": read_jsonl(logs / "sft_metrics.jsonl"),
        "grpo_records": read_jsonl(logs / "grpo_metrics.jsonl"),
        "one_step_off_records": read_jsonl(logs / "grpo_one_step_off_metrics.jsonl"),
        "lora_records": read_jsonl(logs / "grpo_lora_metrics.jsonl"),
        "lora_model": models / "rl_lora",
    }


def lora_figures(
    records: Sequence[Mapping[str, Any]], full: Mapping[str, Any], model: Path, parameters: int, peak_flops: float
) -> dict[str, Any]:
    """The LoRA run beside the full one: update tokens/s, step seconds, the adapter's parameters.

    Its export must be what evaluation reads (a merged folder) with the adapter beside it."""
    adapter = model / "adapter"
    if not (model / "config.json").is_file() or not any(adapter.glob("*.safetensors")):
        raise StageFailed(f"the LoRA GRPO export {model} lacks its merged config.json or adapter/*.safetensors")
    lora = grpo_throughput(records, parameters, peak_flops)
    adapter_parameters = safetensors_parameter_count(adapter)
    return {
        "steps": len(lora["steps"]),
        "train_tokens_per_s": lora["train_tokens_per_s"],
        "full_train_tokens_per_s": full["train_tokens_per_s"],
        "step_s": [r["step_s"] for r in lora["steps"]],
        "full_step_s": [r["step_s"] for r in full["steps"]],
        "adapter_parameters": adapter_parameters,
        "adapter_share": adapter_parameters / parameters,
    }


def one_step_off_figures(records: Sequence[Mapping[str, Any]], synchronous: Sequence[Mapping[str, Any]]):
    """The one-step-off run beside the synchronous one: per-step staleness (never above 1), weight
    push seconds (gloo, both processes on one GPU), rollout wait and step times (they check the
    path; one shared GPU does not measure the overlap)."""
    steps = [r for r in records if r.get("step", 0) > 0]
    staleness = [r.get("rollout/staleness", 0.0) for r in steps]
    if any(s > 1 for s in staleness):
        raise StageFailed(f"one-step-off GRPO: staleness {staleness} exceeds 1")
    return {
        "steps": len(steps),
        "staleness": staleness,
        "weight_sync_s": [r["timing/weight_sync_s"] for r in steps],
        "rollout_wait_s": [r.get("timing/rollout_wait_s", 0.0) for r in steps],
        "step_s": [r["timing/step_s"] for r in steps],
        "synchronous_step_s": [r["timing/step_s"] for r in synchronous if r.get("step", 0) > 0],
    }


def print_summary(summary: Mapping[str, Any], path: Path) -> None:
    sft, grpo = summary["sft"], summary["grpo"]
    rollout = grpo["rollout_tokens_per_s"]
    print(
        f"gpu_check: {summary['model']['parameters']:,} parameters on {summary['device'].get('name', 'CPU')}; "
        f"peak {summary['peak_flops']:.3g} FLOP/s ({summary['peak_flops_source']})"
    )
    print(
        f"gpu_check: SFT  {sft['tokens_per_s']:,.0f} tokens/s, MFU {sft['mfu']:.2%} over {sft['steady_steps']} steps "
        f"(loss {sft['loss_first']:.3f} -> {sft['loss_last']:.3f})"
    )
    print(
        f"gpu_check: GRPO update {grpo['train_tokens_per_s']:,.0f} tokens/s, MFU {grpo['mfu']:.2%}; rollout "
        + (f"{rollout:,.0f} generated tokens/s" if rollout else "n/a")
        + " (last step)"
    )
    off = summary["grpo_one_step_off"]
    print(
        f"gpu_check: GRPO one step off (rollout process on the same GPU): staleness {off['staleness']}, weight push "
        + ", ".join(f"{s:.2f}" for s in off["weight_sync_s"])
        + " s; step "
        + ", ".join(f"{s:.1f}" for s in off["step_s"])
        + " s against "
        + ", ".join(f"{s:.1f}" for s in off["synchronous_step_s"])
        + " s synchronous"
    )
    lora = summary["grpo_lora"]
    print(
        f"gpu_check: GRPO with LoRA (rank 8, {lora['adapter_share']:.2%} of the parameters train): update "
        f"{lora['train_tokens_per_s']:,.0f} tokens/s against {lora['full_train_tokens_per_s']:,.0f} full; step "
        + ", ".join(f"{s:.1f}" for s in lora["step_s"])
        + " s against "
        + ", ".join(f"{s:.1f}" for s in lora["full_step_s"])
        + " s"
    )
    print(f"gpu_check: summary -> {path} ({summary['total_wall_s']:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("summary", nargs="?", type=Path, help="summary JSON (default: $OUT/gpu_check.json)")
    parser.add_argument("--size", choices=sorted(SIZES), default=os.environ.get("GPU_CHECK_SIZE", "0.5b"))
    parser.add_argument("--sft-steps", type=int, help="SFT steps at least (default: the size's)")
    parser.add_argument("--grpo-steps", type=int, default=2)
    parser.add_argument("--warmup-steps", type=int, help="first SFT steps left out of the figures")
    parser.add_argument(
        "--time-limit-s",
        type=float,
        default=default_time_limit(os.environ),
        help="all stages together; a stage past it is killed and the check fails "
        "(default: GPU_CHECK_TIME_LIMIT_S, else the part's cap GPU_CHECK_PART_CAP_S less 15 s, else 245)",
    )
    parser.add_argument("--workdir", type=Path, help="where the data and models go (default: a temporary folder)")
    args = parser.parse_args(argv)
    summary_path = args.summary or default_summary_path()
    size = SIZES[args.size]
    sft_steps = args.sft_steps or size["sft_steps"]
    warmup_steps = size["warmup_steps"] if args.warmup_steps is None else args.warmup_steps
    if sft_steps <= warmup_steps:
        parser.error(f"--sft-steps ({sft_steps}) must exceed the warm-up steps ({warmup_steps})")
    peak_flops, peak_source = peak_flops_from_env(os.environ)

    info = device_info()
    if not info["cuda"] and os.environ.get("GPU_CHECK_ALLOW_CPU") != "1":
        raise SystemExit(
            "gpu_check: torch sees no CUDA GPU; this check measures bf16 training on a GPU. "
            "(GPU_CHECK_ALLOW_CPU=1 --size tiny runs the same stages on a CPU, to test the script.)"
        )
    if info["cuda"] and not info["bf16_supported"]:
        raise SystemExit(f"gpu_check: {info['name']} has no bf16 support")
    print(f"gpu_check: {json.dumps(info)}", flush=True)

    summary: dict[str, Any] = {
        "device": info,
        "size": args.size,
        "peak_flops": peak_flops,
        "peak_flops_source": peak_source,
        "stage_wall_s": {},
    }
    logs = summary_path.parent / "gpu_check_logs"  # stage logs and metrics, kept beside the summary
    logs.mkdir(parents=True, exist_ok=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu_check-"))
    started = time.perf_counter()
    stop_on_sigterm()
    try:
        run = run_stages(
            size,
            sft_steps,
            args.grpo_steps,
            workdir,
            logs,
            time.monotonic() + args.time_limit_s,
            summary["stage_wall_s"],
        )
        sft = sft_throughput(run["sft_records"], run["parameters"], peak_flops, warmup_steps)
        grpo = grpo_throughput(run["grpo_records"], run["parameters"], peak_flops)
        if not math.isfinite(sft["loss_last"]) or sft["loss_last"] >= sft["loss_first"]:
            raise StageFailed(f"SFT loss did not fall ({sft['loss_first']:.4f} -> {sft['loss_last']:.4f})")
        if len(grpo["steps"]) != args.grpo_steps:
            raise StageFailed(f"{len(grpo['steps'])} GRPO steps in the metrics, {args.grpo_steps} asked")
        one_step_off = one_step_off_figures(run["one_step_off_records"], run["grpo_records"])
        if one_step_off["steps"] != args.grpo_steps:
            raise StageFailed(f"{one_step_off['steps']} one-step-off GRPO steps, {args.grpo_steps} asked")
        lora = lora_figures(run["lora_records"], grpo, run["lora_model"], run["parameters"], peak_flops)
        if lora["steps"] != args.grpo_steps:
            raise StageFailed(f"{lora['steps']} LoRA GRPO steps, {args.grpo_steps} asked")
    except (StageFailed, ValueError) as exc:
        summary["error"] = str(exc)
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
        raise SystemExit(f"gpu_check: {exc}") from None
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    summary.update(
        {
            "model": {"parameters": run["parameters"], **size["model"]},
            "mfu_formula": "6 * parameters * tokens / seconds / peak_flops (attention scores not counted)",
            "sft": {
                **sft,
                "zero_stage": 2,
                "dtype": "bfloat16",
                "warmup_steps_left_out": warmup_steps,
                "config": run["sft_config"],
            },
            "grpo": {**grpo, "zero_stage": 2, "dtype": "bfloat16", "engine": "hf", "config": run["grpo_config"]},
            "grpo_one_step_off": {**one_step_off, "placement": "separate", "weight_transfer": "agentrl_gloo"},
            "grpo_lora": {**lora, "rank": 8, "alpha": 32, "lr_scale": 10},
            "total_wall_s": time.perf_counter() - started,
        }
    )
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print_summary(summary, summary_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
