"""The torch dtype a ``dtype`` config key names (``rollout.dtype``, ``sft.deepspeed.dtype``,
``grpo.deepspeed.dtype``): one rule for the engines and the trainers, so that a policy is
generated and trained in the same precision."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def resolve_dtype(name: str, device: str | torch.device) -> torch.dtype:
    """``auto`` is bfloat16 on a GPU and float32 on a CPU (bf16 matmuls on CPU are slow and lossy);
    else the named dtype (``float32``, ``bfloat16``, ``float16``; the schema says which key takes which)."""
    import torch

    if name == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
