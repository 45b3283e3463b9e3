"""Who rolls out and who trains what over the data-parallel ranks of a GRPO step.

Rollouts (``grpo.rollout_queue``). A round's prompts are numbered 0..P-1 (the same list on every
rank: :class:`~agentrl.grpo.prompts.PromptSampler`). With ``shared`` each rank takes the next
unclaimed number from a counter in the process group's key-value store (:class:`ClaimQueue`,
``store.add``: atomic, answered by the store that torchrun's agent already runs for the
rendezvous), one prompt group at a time, whenever one of its groups in flight ends. A rank
whose trajectories end early takes more prompts; a group never spans ranks, so its advantage
needs no communication. With ``fixed`` rank r takes prompts r, r + W, ... (upstream's split of a
batch over its agent-loop workers). Either way a trajectory is the same whichever rank rolls it
out: the sampling seeds are per step, round, problem, sample and turn, never per rank
(:func:`agentrl.rollout.agent_loop.turn_seed`).

Update. The step's groups are the first ``batch_prompts`` kept ones in the order (round,
position) (:func:`select_groups`), whichever rank holds them, and mini-batch m is groups
``m * mini_batch_prompts`` to ``(m + 1) * mini_batch_prompts - 1`` of that order. Within each
mini-batch, :func:`assign_units` gives every unit (a sample, or a prompt group with
``grpo.share_prompts``) a rank: with ``grpo.balance_ranks`` to equal trained-token loads and
equal counts (upstream's ``balance_batch``), else group k of the mini-batch to rank k mod W (with
``fixed`` and no dynamic sampling, the rank that rolled it out: nothing moves). The ranks agree
on the assignment from the samples' lengths alone (:func:`distribute`), then only the samples
that change rank travel. The loss's denominators are all-rank counts, so which rank trains a
sample changes no gradient, only the float summation order.

A rank that dies mid-queue leaves its claimed prompts unrolled; the others finish the round and
fail at the next collective (gloo: the peer's connection closed; NCCL: the collective timeout,
``grpo.collective_timeout_minutes``), and torchrun stops the job when it sees the worker die. No
checkpoint of the unfinished step exists, so a rerun resumes from the last one (the trainer's
stop rules, :mod:`agentrl.grpo.trainer`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from agentrl.grpo.distributed import all_gather
from agentrl.training.deepspeed_engine import DistributedContext

# (rollout round, position in the round's prompt list): a group's place in the step, on every rank
GroupKey = tuple[int, int]


class ClaimQueue:
    """Positions ``0..size-1`` handed out once each, in order, to whichever rank asks first.

    ``store.add(key, 1)`` increments the counter atomically and returns the new value, so every
    claim gets a distinct number; past ``size`` the iteration ends. Keys carry a run token that
    rank 0 drew and every rank received at construction, so a restarted worker group reusing the
    store (torchrun ``--max-restarts``) never sees an earlier run's counters."""

    def __init__(self, store, token: str, label: str, size: int) -> None:
        self.store = store
        self.key = f"agentrl/rollout-queue/{token}/{label}"
        self.size = size

    def __iter__(self) -> Iterator[int]:
        while (position := int(self.store.add(self.key, 1)) - 1) < self.size:
            yield position


def queue_store(ctx: DistributedContext):
    """The process group's store and a token all ranks share (rank 0's, all-gathered)."""
    import torch.distributed as dist

    token = all_gather(ctx, uuid.uuid4().hex)[0]
    # The default group's store: the one init_process_group connected to (torchrun's agent store).
    return dist.distributed_c10d._get_default_store(), token


def fixed_positions(size: int, rank: int, world_size: int) -> list[int]:
    """``grpo.rollout_queue: fixed``: rank r rolls out prompts r, r + W, r + 2W, ..."""
    return list(range(rank, size, world_size))


def select_groups(keys_by_rank: Sequence[Sequence[GroupKey]], count: int) -> list[GroupKey]:
    """The step's groups: the first ``count`` kept groups of all ranks in (round, position) order."""
    return sorted(key for keys in keys_by_rank for key in keys)[:count]


def assign_units(costs: Sequence[int], group_of_unit: Sequence[int], world_size: int, balance: bool) -> list[int]:
    """The rank of each unit of one mini-batch (units in step order).

    ``balance``: longest first, each unit to the rank with the least cost among those holding
    fewer than ``ceil(units / W)`` (ties to the lower rank), so loads and counts are equal as far
    as the units allow (upstream's equal-size partition). Else unit u goes to rank
    ``group_of_unit[u] mod W``, whole groups together."""
    if not balance:
        return [group % world_size for group in group_of_unit]
    cap = -(-len(costs) // world_size)
    loads, counts = [0] * world_size, [0] * world_size
    ranks = [0] * len(costs)
    for unit in sorted(range(len(costs)), key=lambda u: (-costs[u], u)):
        rank = min((r for r in range(world_size) if counts[r] < cap), key=lambda r: (loads[r], r))
        ranks[unit] = rank
        loads[rank] += costs[unit]
        counts[rank] += 1
    return ranks


@dataclass(frozen=True)
class SampleInfo:
    """What the ranks need to agree where a sample trains: its place and its trained tokens."""

    group: GroupKey
    index: int  # the sample's index in its group
    cost: int  # prompt + response tokens when it runs forward and backward, else 0


def distribute(
    ctx: DistributedContext,
    local: dict[tuple[GroupKey, int], object],
    infos: Sequence[SampleInfo],
    mini_groups: Sequence[Sequence[GroupKey]],
    *,
    by_group: bool,
    balance: bool,
) -> list[list[object]]:
    """This rank's samples of each mini-batch after the assignment, in step order.

    ``local`` maps (group key, index) to the samples this rank holds; ``infos`` describes this
    rank's samples; ``mini_groups`` are the step's groups per mini-batch (the same on every rank).
    Units are samples, or whole groups with ``by_group``. Two exchanges: the samples'
    :class:`SampleInfo` (small), then the samples that change rank."""
    position = {key: (m, g) for m, mini in enumerate(mini_groups) for g, key in enumerate(mini)}

    def step_order(sample: tuple[GroupKey, int]) -> tuple[int, int, int]:
        return (*position[sample[0]], sample[1])

    if ctx.world_size == 1:
        destination = dict.fromkeys(local, 0)
    else:
        everyone = sorted(
            (info for rank_infos in all_gather(ctx, list(infos)) for info in rank_infos),
            key=lambda i: step_order((i.group, i.index)),
        )
        destination = {}
        for m in range(len(mini_groups)):
            members = [info for info in everyone if position[info.group][0] == m]
            units: list[list[SampleInfo]] = []
            for info in members:  # in step order: a group's samples are consecutive
                if by_group and units and units[-1][0].group == info.group:
                    units[-1].append(info)
                else:
                    units.append([info])
            ranks = assign_units(
                [sum(info.cost for info in unit) for unit in units],
                [position[unit[0].group][1] for unit in units],
                ctx.world_size,
                balance,
            )
            destination.update({(info.group, info.index): rank for unit, rank in zip(units, ranks) for info in unit})
    mine = {s: sample for s, sample in local.items() if destination[s] == ctx.rank}
    if ctx.world_size > 1:
        moving = {s: sample for s, sample in local.items() if destination[s] != ctx.rank}
        for sent in all_gather(ctx, moving):
            mine.update({s: sample for s, sample in sent.items() if destination[s] == ctx.rank})
    out: list[list[object]] = [[] for _ in mini_groups]
    for s in sorted(mine, key=step_order):
        out[position[s[0]][0]].append(mine[s])
    return out
