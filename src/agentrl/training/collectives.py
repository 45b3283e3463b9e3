"""Agreements between ranks that keep their collectives in step.

Under ZeRO-3 every call of a partitioned module is a collective (its parameters are gathered
before and released after), so a forward whose number of module calls depends on the rank's
data (chunks of trained tokens, micro-batches of a token budget) must first agree on that number
across ranks; the ranks with less work then make the extra calls on a dummy input whose result
is weighted 0. One process, or no process group, agrees with itself without a collective.
"""

from __future__ import annotations

import torch


def max_over_ranks(value: int, device: torch.device | str = "cpu") -> int:
    """The largest ``value`` any rank of the default process group holds (a MAX all-reduce).

    ``device`` is where the one-element tensor lives: the GPU under NCCL, the CPU under gloo.
    """
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return value
    agreed = torch.tensor([value], dtype=torch.int64, device=device)
    torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MAX)
    return int(agreed.item())
