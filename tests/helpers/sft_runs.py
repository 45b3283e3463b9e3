"""``python -m agentrl sft`` on a tiny Qwen3 and real tool-use conversations: inputs, commands, results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from agentrl.data.prompts import CODE_INTERPRETER_TOOL
from agentrl.data.records import SftExample, write_records
from agentrl.model.build import save_embedded_model
from helpers.tiny_models import SFT_RUN

BASE_SFT = {
    "epochs": 2,
    "global_batch_size": 4,
    "micro_batch_size": 2,
    "lr": 1e-2,
    "warmup_ratio": 0.2,
    "max_length": 512,
    "save_every_steps": 0,
}


def sft_conversation(index: int) -> SftExample:
    """A tool-use multiplication, its tool output computed, a boxed answer of varying length."""
    a, b = 37 + 11 * index, 5 + 3 * index
    code = f"print({a} * {b})"
    messages = [
        {"role": "user", "content": f"Compute {a} * {b}. Use the code tool, then give the answer in \\boxed{{}}."},
        {
            "role": "assistant",
            "content": "Let me compute it with the tool.",
            "tool_calls": [{"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}],
        },
        {"role": "tool", "content": f"{a * b}\n"},
        {
            "role": "assistant",
            "content": f"The result is {a * b}." + " I checked it." * (index % 4) + f"\n\\boxed{{{a * b}}}",
        },
    ]
    return SftExample(id=f"arith-{index}", messages=messages, tools=[CODE_INTERPRETER_TOOL])


def sft_workspace(root: Path, examples: list[SftExample] | None = None, shape=SFT_RUN) -> Path:
    """``root`` with tool-use conversations (sft.parquet; default: 24 of :func:`sft_conversation`)
    and a tiny base model of ``shape`` whose tokenizer is trained on them (base/)."""
    from agentrl.model.build import train_tokenizer

    examples = [sft_conversation(i) for i in range(24)] if examples is None else examples
    write_records(examples, root / "sft.parquet")
    renderer = train_tokenizer(["0123456789"], 300, "qwen3")
    corpus = [renderer.apply_chat_template(e.messages, tools=e.tools, tokenize=False) for e in examples]
    save_embedded_model(corpus, shape, seed=0, out_dir=root / "base")
    return root


def sft_run_args(root: Path, name: str, sft: dict, nproc: int) -> list[str]:
    """``python -m agentrl sft`` on ``sft_workspace(root)`` with outputs under ``root / name``."""
    run = root / name
    return [
        sys.executable,
        "-m",
        "agentrl",
        "sft",
        "--config-json",
        json.dumps({"seed": 3, "sft": sft}),
        "--model",
        str(root / "base"),
        "--data",
        str(root / "sft.parquet"),
        "--out",
        str(run / "model"),
        "--metrics",
        str(run / "metrics.jsonl"),
        "--checkpoint-dir",
        str(run / "ckpt"),
        "--nproc",
        str(nproc),
    ]


def sft_env() -> dict[str, str]:
    """This environment without a launcher's rank variables, one OpenMP thread."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"  # identical arithmetic in every run, and no oversubscription
    return env


def train_sft_run(root: Path, name: str, sft: dict, nproc: int = 1) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """Run :func:`sft_run_args` to the end (it must succeed); its :func:`sft_run_results`."""
    done = subprocess.run(
        sft_run_args(root, name, sft, nproc), env=sft_env(), capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return sft_run_results(root / name)


def sft_run_results(run: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """A finished run's metrics records and final weights."""
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return metrics, load_file(run / "model" / "model.safetensors")
