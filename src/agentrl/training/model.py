"""The model a training stage starts from: a Hugging Face causal-LM folder."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.errors import ModelFolderError


def load_causal_lm(
    model_dir: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
    gradient_checkpointing: bool = False,
) -> torch.nn.Module:
    """``AutoModelForCausalLM`` from ``model_dir`` in ``dtype``, on ``device``, in train mode.

    Gradient checkpointing (non-reentrant) recomputes activations in backward; transformers only
    applies it in train mode, hence the mode. A frozen copy (GRPO's reference) is ``.eval()``-ed
    by its caller.
    """
    from transformers import AutoModelForCausalLM

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise ModelFolderError(f"{model_dir}: not a Hugging Face model folder (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if device is not None:
        model = model.to(device)
    return model.train()
