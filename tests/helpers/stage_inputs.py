"""Inputs that pass a stage's cheap checks (a one-row problem, a one-turn SFT example, a model folder
with nothing to load) and the stage command lines the bad-input tests run on them."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pandas as pd

from agentrl.data.records import Problem, SftExample
from helpers.workflows import ROOT

CODE_PROBLEM = Problem(
    "p0", "embedded-code", [{"role": "user", "content": "hi"}], "code", {"inputs": ["1"], "outputs": ["1"]}
)


def fake_model(folder: Path, tokenizer: bool = True) -> Path:
    """A folder that passes the cheap checks: config, a valid safetensors header, a tokenizer file
    with a chat template."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
        (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    return folder


SFT_EXAMPLE = SftExample("s0", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], [])


def problems_file(path: Path, rows: list[dict]) -> Path:
    """``rows`` written to ``path`` as they are (no record schema applied)."""
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def sft_command(tmp_path: Path, model: Path, data: Path, **outputs: Path) -> list:
    """The ``sft`` stage's arguments on ``model`` and ``data``, outputs under ``tmp_path`` unless given."""
    paths = {"out": tmp_path / "out/sft", "metrics": tmp_path / "out/metrics.jsonl", "checkpoint_dir": tmp_path / "ck"}
    paths.update(outputs)
    return ["sft", "--model", model, "--data", data, "--out", paths["out"], "--metrics", paths["metrics"],
            "--checkpoint-dir", paths["checkpoint_dir"], "--nproc", "0"]  # fmt: skip


def run_agentrl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m agentrl ARGS`` in ``cwd`` with this checkout's src first, its output captured."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "agentrl", *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def assert_refused(completed: subprocess.CompletedProcess, *fragments: str) -> None:
    """Refused the way a user's mistake is: exit 2, no traceback, each fragment in the message."""
    assert completed.returncode == 2, (completed.returncode, completed.stderr[-2000:])
    assert "Traceback" not in completed.stderr, completed.stderr[-2000:]
    for fragment in fragments:
        assert fragment in completed.stderr, (fragment, completed.stderr[-2000:])
