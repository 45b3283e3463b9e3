"""How much of its GPU a colocated vLLM engine takes beside the GRPO trainer (``rollout.vllm.colocated_memory``).

``fraction`` (the default) is ``rollout.vllm.colocated_gpu_memory_utilization`` as configured.
``measured`` sizes it on the rank's GPU when the engine is built, after the trainer's DeepSpeed
engine: what is free then (torch's cache of the trainer's transient memory returned first:
:func:`free_device_memory`), less what the trainer still allocates at its first step, less a
headroom, is the engine's (:func:`colocated_memory_plan`). The trainer's resident memory while
the engine is awake is then measured, not guessed: bf16 weights and the fp32 master shard exist
at that point; AdamW's two fp32 moments and the fp32 gradient partition appear at the first step
(:func:`trainer_growth_bytes`). vLLM's ``gpu_memory_utilization`` is a share of the *total*
memory that must be free when it starts (``gpu_worker.py``), and its KV cache is that share less
the weights, its profiled activation peak and its own non-torch allocations
(``engine_overhead_bytes``). The arithmetic for 80 GB and 141 GB GPUs is in docs/paper-scale.md.

A paper-preset rollout batch at full length (128 trajectories per rank of 2560 + ~150 + 20480
tokens, 144 KiB of KV per token for Qwen3-4B) is about 400 GiB: no single GPU holds it; the plan
reports how many full-length trajectories fit at once (vLLM pre-empts and recomputes beyond
that), which is what a larger share buys.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
# vLLM's profiled activation peak, CUDA graphs and its non-torch allocations (cuBLAS workspaces,
# NCCL buffers) for a 4B-7B model: an estimate until benchmarks/gpu_check.sh measures it.
ENGINE_OVERHEAD_BYTES = 4 * GIB
# Left free beyond the plan: allocator fragmentation, the sandbox's CUDA-free children, the
# trainer's temporaries while the engine is awake.
HEADROOM_BYTES = 2 * GIB


@dataclass(frozen=True)
class ColocatedMemoryPlan:
    """The engine's share of the GPU and what its KV cache then holds."""

    total_bytes: int
    engine_bytes: int  # gpu_memory_utilization x total
    gpu_memory_utilization: float
    kv_cache_bytes: int
    kv_tokens: int
    trajectory_tokens: int  # one trajectory at full length (the engine's context)
    trajectories_per_rank: int
    full_trajectories_at_once: int  # of full length, in the KV cache together

    @property
    def holds_rollout_batch(self) -> bool:
        return self.full_trajectories_at_once >= self.trajectories_per_rank

    def summary(self) -> str:
        return (
            f"colocated engine: {self.gpu_memory_utilization:.3f} of {self.total_bytes / GIB:.1f} GiB, "
            f"KV cache {self.kv_cache_bytes / GIB:.1f} GiB = {self.kv_tokens} tokens: "
            f"{self.full_trajectories_at_once} of the rank's {self.trajectories_per_rank} trajectories "
            f"at their full {self.trajectory_tokens} tokens at once"
        )


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Keys and values of every layer: ``2 x layers x kv_heads x head_dim x dtype_bytes``
    (Qwen3-4B in bf16: 2 x 36 x 8 x 128 x 2 = 147,456 bytes = 144 KiB)."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def trainer_growth_bytes(parameters: int, world_size: int, zero_stage: int, param_bytes: int) -> int:
    """Bytes the trainer allocates at its first step, after the engine was sized.

    ZeRO-2/3: AdamW's two moments and the gradient partition, fp32 (``grad_accum_dtype``), each
    of the rank's ``1/world`` shard: ``3 x 4 x ceil(P / W)``. ZeRO-0: torch's AdamW on the
    module's own parameters (moments in their dtype) and full gradients: ``3 x param_bytes x P``.
    """
    if zero_stage >= 1:
        return 3 * 4 * math.ceil(parameters / world_size)
    return 3 * param_bytes * parameters


def colocated_memory_plan(
    *,
    total_bytes: int,
    free_bytes: int,
    trainer_growth: int,
    weight_bytes: int,
    kv_per_token: int,
    trajectory_tokens: int,
    trajectories_per_rank: int,
    engine_overhead_bytes: int = ENGINE_OVERHEAD_BYTES,
    headroom_bytes: int = HEADROOM_BYTES,
) -> ColocatedMemoryPlan:
    """The engine's share of the GPU, from what is free once the trainer is built::

        engine  = free - trainer_growth - headroom
        share   = engine / total                       (vLLM's gpu_memory_utilization)
        kv      = engine - weights - engine_overhead
        at once = floor(kv / kv_per_token / trajectory_tokens)

    Raises ValueError when the engine would have no KV cache left.
    """
    engine = free_bytes - trainer_growth - headroom_bytes
    kv = engine - weight_bytes - engine_overhead_bytes
    if kv <= 0:
        raise ValueError(
            f"the colocated engine has no room: {free_bytes / GIB:.1f} GiB free of {total_bytes / GIB:.1f} GiB, "
            f"the trainer still needs {trainer_growth / GIB:.1f} GiB, the engine {weight_bytes / GIB:.1f} GiB of "
            f"weights + {engine_overhead_bytes / GIB:.1f} GiB; use rollout.vllm.colocated_memory: fraction "
            "or more GPUs (a smaller ZeRO shard)"
        )
    kv_tokens = kv // kv_per_token
    return ColocatedMemoryPlan(
        total_bytes=total_bytes,
        engine_bytes=engine,
        gpu_memory_utilization=round(engine / total_bytes, 4),
        kv_cache_bytes=kv,
        kv_tokens=kv_tokens,
        trajectory_tokens=trajectory_tokens,
        trajectories_per_rank=trajectories_per_rank,
        full_trajectories_at_once=kv_tokens // trajectory_tokens,
    )


@dataclass(frozen=True)
class TrainerMemory:
    """What the GRPO trainer tells its colocated engine for ``colocated_memory: measured``."""

    parameters: int  # the policy's (the engine holds them in its dtype)
    growth_bytes: int  # trainer_growth_bytes(...)
    trajectories_per_rank: int  # batch_prompts x n / world size


def free_device_memory() -> tuple[int, int]:
    """(free, total) bytes of this process's CUDA device once torch's cache is returned to it.

    DeepSpeed's ZeRO-2 flattening leaves the model's old per-parameter bf16 storage (~7.5 GiB
    for a 4B model) in torch's caching allocator: free to torch, not to the device, so
    ``mem_get_info`` alone counts it as the trainer's. vLLM empties that cache when its worker
    starts (``init_device``), after the share was chosen; emptying it first measures what vLLM
    will find.
    """
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()


def measured_plan(model_dir: str | Path, cfg, trainer: TrainerMemory, context: int) -> ColocatedMemoryPlan:
    """:func:`colocated_memory_plan` on this process's CUDA device, now (``cfg``: the rollout section)."""
    from agentrl.precision import resolve_dtype

    free, total = free_device_memory()
    dtype_bytes = resolve_dtype(cfg.dtype, "cuda").itemsize
    return colocated_memory_plan(
        total_bytes=total,
        free_bytes=free,
        trainer_growth=trainer.growth_bytes,
        weight_bytes=trainer.parameters * dtype_bytes,
        kv_per_token=model_kv_bytes_per_token(model_dir, dtype_bytes),
        trajectory_tokens=context,
        trajectories_per_rank=trainer.trajectories_per_rank,
    )


def model_kv_bytes_per_token(model_dir: str | Path, dtype_bytes: int) -> int:
    """:func:`kv_bytes_per_token` of a Hugging Face folder's ``config.json``."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    return kv_bytes_per_token(config["num_hidden_layers"], kv_heads, head_dim, dtype_bytes)
