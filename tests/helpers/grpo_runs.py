"""The GRPO stage on the tiny random policy: its config, inputs, paths, command lines, metrics."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agentrl.data.records import Problem

TINY_RUN = {
    "rollout": {"max_response_tokens": 24, "max_turns": 2, "batch_size": 16},
    "reward": {"overlong": {"max_response_length": 24, "buffer_length": 8}},
    "sandbox": {"workers": 2},
    "grpo": {
        "batch_prompts": 2,
        "n": 2,
        "mini_batch_prompts": 1,
        "max_steps": 4,
        "save_freq": 1,
        "keep_checkpoints": 2,
        "test_freq": 2,
        "val_before_train": True,
        "micro_batch_tokens": 64,
        "lr": 1e-3,
        "validation": {"n": 1},
    },
}
GRPO_STEPS = 8  # unsaved_grpo_command's run length


def arith_split(count: int, split: str) -> list[Problem]:
    """``count`` tool-use additions with ids ``{split}-{i}`` (answer ``2i + 3``)."""
    return [
        Problem(
            f"{split}-{i}",
            "embedded-arith",
            [
                {
                    "role": "user",
                    "content": f"Compute {i} + {i + 3}. Use the code tool, then give the answer in \\boxed{{}}.",
                }
            ],
            "math",
            str(2 * i + 3),
        )
        for i in range(count)
    ]


def write_arith_inputs(root: Path) -> Path:
    """``root`` with the tiny run's RL data (9 problems, rl_train.parquet) and eval set (3, arith.parquet)."""
    from agentrl.data.records import write_records

    write_records(arith_split(9, "rl"), root / "rl_train.parquet")
    write_records(arith_split(3, "eval"), root / "arith.parquet")
    return root


def grpo_paths(model: Path, root: Path, run: Path):
    """The stage paths of a run in ``run`` on ``root``'s rl_train.parquet and arith.parquet (ZeRO-0)."""
    from agentrl.grpo.trainer import GrpoPaths
    from agentrl.training.deepspeed_engine import find_deepspeed_config

    return GrpoPaths(
        model,
        root / "rl_train.parquet",
        (root / "arith.parquet",),
        run / "rl",
        run / "metrics.jsonl",
        run / "checkpoints",
        find_deepspeed_config(0),
    )


def metric_records(path: Path) -> list[dict]:
    """The metrics.jsonl records of a run (the file must exist)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def grpo_command(model: Path, root: Path, run: Path) -> list[str]:
    """``python -m agentrl grpo`` of ``TINY_RUN`` in one process, one thread, outputs under ``run``."""
    return [
        sys.executable,
        "-m",
        "agentrl",
        "grpo",
        "--config-json",
        json.dumps(TINY_RUN),
        "--model",
        str(model),
        "--train",
        str(root / "rl_train.parquet"),
        "--eval",
        str(root / "arith.parquet"),
        "--out",
        str(run / "rl"),
        "--metrics",
        str(run / "metrics.jsonl"),
        "--checkpoint-dir",
        str(run / "checkpoints"),
        "--nproc",
        "0",
        "--threads",
        "1",
    ]


def unsaved_grpo_command(model: Path, root: Path, run: Path, **grpo) -> list[str]:
    """The tiny run for ``GRPO_STEPS`` steps with no step-interval checkpoint, ``grpo`` on top."""
    command = grpo_command(model, root, run)
    config = {**TINY_RUN, "grpo": {**TINY_RUN["grpo"], "max_steps": GRPO_STEPS, "save_freq": 0, **grpo}}
    command[command.index("--config-json") + 1] = json.dumps(config)
    return command


def metric_records_so_far(path: Path) -> list[dict]:
    """The records written so far: none before the file exists."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def rollout_process_under(root: Path) -> int | None:
    """The pid of the rollout process under the GRPO stage started as process group ``root``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[2]) == root and b"spawn_main" in cmdline:
                return int(entry.name)
    return None
