"""Inputs that pass a stage's cheap checks: a one-row problem and a model folder with nothing to load."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from agentrl.data.records import Problem

CODE_PROBLEM = Problem(
    "p0", "embedded-code", [{"role": "user", "content": "hi"}], "code", {"inputs": ["1"], "outputs": ["1"]}
)


def fake_model(folder: Path, tokenizer: bool = True) -> Path:
    """A folder that passes the cheap checks: config, a valid safetensors header, a tokenizer file."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return folder
