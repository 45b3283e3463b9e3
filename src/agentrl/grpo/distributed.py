"""Collectives the GRPO step needs beyond DeepSpeed's, and the optimizer step with its grad norm.

The process group, the engine, checkpoints and the final export are
:mod:`agentrl.training.deepspeed_engine`'s (shared with SFT). Every helper here is free for a
world of one, so the single-process CPU run pays nothing for data parallelism.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from agentrl.training.deepspeed_engine import DistributedContext


def all_reduce(ctx: DistributedContext, value: float, op: str = "sum") -> float:
    """``value`` summed (``op="sum"``) or maxed (``"max"``) over the ranks."""
    if ctx.world_size == 1:
        return float(value)
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return float(tensor.item())


def all_gather(ctx: DistributedContext, obj: Any) -> list[Any]:
    """Every rank's (picklable) ``obj``, in rank order."""
    if ctx.world_size == 1:
        return [obj]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier(ctx: DistributedContext) -> None:
    if ctx.world_size > 1:
        dist.barrier()


def step_with_grad_norm(engine) -> float:
    """``engine.step()`` and the global gradient norm before clipping.

    DeepSpeed reports the norm with ZeRO or bf16; in plain fp32 its clipping computes and
    discards it, so it is computed here first, from the gradients DeepSpeed has already averaged
    over the ranks in the boundary ``backward``.
    """
    precomputed = None
    if not (engine.bfloat16_enabled() or engine.fp16_enabled() or engine.zero_optimization()):
        grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
        precomputed = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    engine.step()
    norm = engine.get_global_grad_norm()
    if norm is not None:
        return float(norm)
    return precomputed if precomputed is not None else float("nan")
