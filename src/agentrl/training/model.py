"""The model a training stage starts from: a Hugging Face causal-LM folder."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.config import LoraConfig
from agentrl.errors import ModelFolderError
from agentrl.training.lora import add_adapters, check_target_modules


def load_causal_lm(
    model_dir: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
    gradient_checkpointing: bool = False,
    lora: LoraConfig | None = None,
    lora_key: str = "lora",
    seed: int = 0,
) -> torch.nn.Module:
    """``AutoModelForCausalLM`` from ``model_dir`` in ``dtype``, on ``device``, in train mode.

    Gradient checkpointing (non-reentrant) recomputes activations in backward; transformers only
    applies it in train mode, hence the mode. A frozen copy (GRPO's reference) is ``.eval()``-ed
    by its caller.

    With ``lora.enabled`` the model comes wrapped in PEFT's LoRA adapters, only they trainable
    (:mod:`agentrl.training.lora`; ``seed`` draws their initial ``A``); its target modules are
    checked against ``config.json`` before the weights load, a wrong one named under ``lora_key``.
    """
    from transformers import AutoModelForCausalLM

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise ModelFolderError(f"{model_dir}: not a Hugging Face model folder (no config.json)")
    adapters = lora is not None and lora.enabled
    if adapters:
        check_target_modules(model_dir, lora, lora_key)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if adapters:  # on the host, before the move: the adapters' initialisation draws from the CPU generator
        model = add_adapters(model, lora, seed)
    if device is not None:
        model = model.to(device)
    return model.train()
