"""Tiny stand-ins for released hub models: real Hugging Face folders built by the package's own builder.

No network here, so a local folder takes the place of a hub id (``sft.from``, ``eval.checkpoints``).
The folders are the embedded model at its smallest (a byte-level BPE tokenizer trained on a few
lines, a 2-layer Qwen3): loadable by transformers and vLLM, fast enough for a CPU workflow run.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.model.build import save_embedded_model
from helpers.tiny_models import RELEASED_STAND_IN

CORPUS = [
    "Solve the problem. Put the final answer in \\boxed{}.",
    '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1 + 1)"}}\n</tool_call>',
    "Write a Python program that reads the input and prints the answer.",
]


def build_fixture_model(folder: Path, seed: int = 0) -> Path:
    """A fresh tiny model in ``folder``; another seed gives other weights (and another digest)."""
    return save_embedded_model(CORPUS, RELEASED_STAND_IN, seed, folder)
