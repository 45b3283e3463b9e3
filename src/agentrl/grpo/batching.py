"""From trajectories to training tensors: samples, micro-batches by token budget, padding.

A :class:`PolicySample` is one trajectory as the update sees it: the token ids ``prompt +
response`` and, over the response positions only, the loss mask (1 on sampled tokens, 0 on
tool responses and template tokens inserted by the agent loop), the sampling log-probs, the
log-probs recomputed by the actor before the update (``old_logp``), the reference model's (for
the KL variants) and the sequence's advantage.

Tensors of a micro-batch live in the *response frame* ``(B, R)``: column k of row i is response
token k of sample i, predicted by the hidden state at position ``prompt_len_i - 1 + k`` of
sample i's input. Positions past a sample's response are padding with loss mask 0.

The input is one packed row (``grpo.packing``, :func:`pack_token_budget`): the samples end to
end with their own positions, attention within each (:mod:`agentrl.training.packing`), the
samples of one prompt in a micro-batch computing it once, each micro-batch filled first-fit to
``grpo.micro_batch_tokens`` real tokens (prompts counted per sample), no padding computed.
Or right-padded ``(B, L)`` (:func:`pack_micro_batches`): samples sorted longest first, each
micro-batch filled while ``rows * longest <= budget``. Either way a forward never holds more than
the budget and a sample longer than it runs alone (it cannot be split). The loss of a
micro-batch is divided by the *mini-batch's* token (or sequence) count, so the split changes no
gradient (``algorithm.aggregate_loss``).

With ``grpo.share_prompts`` the ``n`` samples of a prompt also share its forward: a micro-batch
holds whole prompt groups (:func:`pack_prompt_groups`) and carries :class:`SharedPrompts`, the
distinct prompts once and the responses apart; the actor runs the prompts, hands their keys and
values to every response of the group, and runs the responses (``policy.ResponseLogProbs``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from agentrl.data.records import Trajectory
from agentrl.training.packing import PackedRow, pack_sequences


@dataclass
class PolicySample:
    input_ids: list[int]  # prompt + response
    prompt_length: int
    loss_mask: list[int]  # (R,) over the response
    sampling_logp: list[float]  # (R,) from the rollout engine, 0.0 where the mask is 0
    advantage: float
    old_logp: list[float] | None = None  # (R,) recomputed by the actor before the update
    ref_logp: list[float] | None = None  # (R,) under the reference model (KL variants)

    @property
    def response_length(self) -> int:
        return len(self.input_ids) - self.prompt_length

    @property
    def prompt_ids(self) -> list[int]:
        return self.input_ids[: self.prompt_length]

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    @classmethod
    def from_trajectory(cls, trajectory: Trajectory, advantage: float) -> PolicySample:
        response = list(trajectory.response_ids)
        assert len(response) == len(trajectory.loss_mask) == len(trajectory.logprobs), (
            f"trajectory {trajectory.problem_id}#{trajectory.sample_index}: {len(response)} response ids, "
            f"{len(trajectory.loss_mask)} mask entries, {len(trajectory.logprobs)} log-probs"
        )
        assert response, f"trajectory {trajectory.problem_id}#{trajectory.sample_index} has an empty response"
        return cls(
            input_ids=list(trajectory.prompt_ids) + response,
            prompt_length=len(trajectory.prompt_ids),
            loss_mask=list(trajectory.loss_mask),
            sampling_logp=list(trajectory.logprobs),
            advantage=float(advantage),
        )


@dataclass(frozen=True)
class MiniBatchPlan:
    """One optimizer step of the update: ``members`` are its sample indices (its loss's token and
    sequence counts), ``micro_batches`` those of them that run forward and backward, packed by
    token budget (``[]``: a padding micro-batch of zero loss)."""

    members: list[int]
    micro_batches: list[list[int]]


def pack_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Indices grouped so that ``len(group) * max(length in group) <= token_budget`` (padded tokens).

    Longest first; a single sequence over the budget forms its own group. Every index appears
    exactly once.
    """
    assert token_budget >= 1, f"token_budget must be >= 1, got {token_budget}"
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for index in order:
        # Sorted longest first, so the group's first member sets its padded width.
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= token_budget:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def pack_token_budget(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Indices grouped so that ``sum(length in group) <= token_budget`` (packed: no padding).

    First-fit decreasing: longest first, each into the first group it fits, so a micro-batch is
    filled by the short sequences the long ones leave room for and the count stays near
    ``sum(lengths) / budget``. A single sequence over the budget forms its own group. Every
    index appears exactly once.
    """
    assert token_budget >= 1, f"token_budget must be >= 1, got {token_budget}"
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    loads: list[int] = []
    for index in order:
        fit = next((g for g, load in enumerate(loads) if load + lengths[index] <= token_budget), None)
        if fit is None:
            groups.append([index])
            loads.append(lengths[index])
        else:
            groups[fit].append(index)
            loads[fit] += lengths[index]
    return groups


def prompt_groups(samples: Sequence[PolicySample], indices: Sequence[int]) -> list[list[int]]:
    """``indices`` cut into runs of consecutive samples with the same prompt (a GRPO group)."""
    runs: list[list[int]] = []
    for index in indices:
        sample = samples[index]
        if runs:
            first = samples[runs[-1][0]]
            if first.prompt_length == sample.prompt_length and first.prompt_ids == sample.prompt_ids:
                runs[-1].append(index)
                continue
        runs.append([index])
    return runs


def pack_prompt_groups(
    groups: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int],
    response_lengths: Mapping[int, int] | Sequence[int],
    token_budget: int,
) -> list[list[int]]:
    """Micro-batches of whole prompt groups, each within ``token_budget`` padded tokens.

    A micro-batch of ``G`` prompts and ``B`` responses computes ``G * max prompt + B * max
    response`` padded positions (the prompts once, then the responses over their keys), which is
    what the budget bounds. ``groups[g]`` are sample indices and ``prompt_lengths[g]`` their
    prompt's length; ``response_lengths`` is indexed by sample. Groups go longest first; a group
    over the budget alone is cut into runs of members that fit (each run computes the prompt
    again), a single member over it runs alone. Every index appears exactly once.
    """
    assert token_budget >= 1, f"token_budget must be >= 1, got {token_budget}"
    units: list[tuple[int, list[int]]] = []  # (prompt length, members), each unit fitting if it can
    for members, prompt_length in zip(groups, prompt_lengths):
        members = sorted(members, key=lambda i: (-response_lengths[i], i))
        run: list[int] = []
        for index in members:
            longest = response_lengths[run[0]] if run else response_lengths[index]
            if run and prompt_length + (len(run) + 1) * longest > token_budget:
                units.append((prompt_length, run))
                run = []
            run.append(index)
        units.append((prompt_length, run))

    def cost(batch: list[tuple[int, list[int]]]) -> int:
        prompts = max(p for p, _ in batch) * len(batch)
        rows = sum(len(m) for _, m in batch)
        return prompts + rows * max(response_lengths[i] for _, m in batch for i in m)

    units.sort(key=lambda u: (-(u[0] + max(response_lengths[i] for i in u[1])), u[1][0]))
    batches: list[list[tuple[int, list[int]]]] = []
    for unit in units:
        if batches and cost([*batches[-1], unit]) <= token_budget:
            batches[-1].append(unit)
        else:
            batches.append([unit])
    return [[i for _, members in batch for i in members] for batch in batches]


@dataclass
class SharedPrompts:
    """The distinct prompts of a micro-batch, once, and each row's response apart.

    ``prompt_ids`` ``(G, P)`` right-padded; ``row_prompt[i]`` the prompt of row ``i``;
    ``response_ids`` ``(B, R)`` right-padded, in the response frame (column k = response token k).
    """

    prompt_ids: torch.Tensor  # (G, P)
    prompt_mask: torch.Tensor  # (G, P)
    row_prompt: torch.Tensor  # (B,) index into the prompts
    response_ids: torch.Tensor  # (B, R)
    response_mask: torch.Tensor  # (B, R) 1 on the response's tokens (all of them, loss or not)

    def to(self, device: torch.device | str) -> SharedPrompts:
        return SharedPrompts(**{name: value.to(device) for name, value in self.__dict__.items()})


@dataclass
class MicroBatch:
    """Padded tensors of a few samples; ``(B, L)`` inputs and ``(B, R)`` response-frame values."""

    input_ids: torch.Tensor  # (B, L) right-padded, or (1, T) packed
    attention_mask: torch.Tensor | None  # (B, L); None when packed
    response_start: torch.Tensor  # (B,) prompt length: first response position
    response_length: torch.Tensor  # (B,)
    loss_mask: torch.Tensor  # (B, R)
    advantages: torch.Tensor  # (B, R), the sequence advantage on every loss token
    sampling_logp: torch.Tensor  # (B, R)
    old_logp: torch.Tensor | None  # (B, R)
    ref_logp: torch.Tensor | None  # (B, R)
    shared: SharedPrompts | None = None  # set: the actor runs each distinct prompt once
    packed: PackedRow | None = None  # set: the samples end to end in one row (input_ids is its (1, T))

    @property
    def num_tokens(self) -> int:
        """Tokens of the forward, padding included."""
        if self.shared is not None:
            return int(self.shared.prompt_ids.numel() + self.shared.response_ids.numel())
        return int(self.input_ids.numel())

    def to(self, device: torch.device | str) -> MicroBatch:
        moved = {
            name: (value.to(device) if isinstance(value, (torch.Tensor, SharedPrompts, PackedRow)) else value)
            for name, value in self.__dict__.items()
        }
        return MicroBatch(**moved)


def _response_frame(rows: Sequence[Sequence[float]], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def collate(
    samples: Sequence[PolicySample], pad_token_id: int, share_prompts: bool = False, packed: bool = False
) -> MicroBatch:
    """``samples`` as a :class:`MicroBatch` (on the CPU): right-padded ``(B, L)`` inputs, or with
    ``packed`` one row of the samples end to end (:class:`~agentrl.training.packing.PackedRow`);
    ``share_prompts`` adds :class:`SharedPrompts` for runs of consecutive samples with the same
    prompt (padded). The response-frame tensors are the same either way."""
    assert samples, "cannot collate an empty micro-batch"
    assert not (packed and share_prompts), "a micro-batch is packed or shares its prompts, not both"
    response_width = max(s.response_length for s in samples)
    row = pack_sequences([s.input_ids for s in samples], [s.prompt_length for s in samples]) if packed else None
    if row is not None:
        input_ids, attention_mask = row.input_ids, None
    else:
        input_ids, attention_mask = _right_padded([s.input_ids for s in samples], pad_token_id)
    loss_mask = _response_frame([s.loss_mask for s in samples], response_width, torch.long)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)[:, None] * (loss_mask > 0)
    has_old = all(s.old_logp is not None for s in samples)
    has_ref = all(s.ref_logp is not None for s in samples)
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_start=torch.tensor([s.prompt_length for s in samples], dtype=torch.long),
        response_length=torch.tensor([s.response_length for s in samples], dtype=torch.long),
        loss_mask=loss_mask,
        advantages=advantages,
        sampling_logp=_response_frame([s.sampling_logp for s in samples], response_width, torch.float32),
        old_logp=_response_frame([s.old_logp for s in samples], response_width, torch.float32) if has_old else None,
        ref_logp=_response_frame([s.ref_logp for s in samples], response_width, torch.float32) if has_ref else None,
        shared=_shared_prompts(samples, response_width, pad_token_id) if share_prompts else None,
        packed=row,
    )


def _right_padded(rows: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, L)`` token ids right-padded with ``pad_token_id``, and the attention mask."""
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        attention_mask[i, : len(r)] = 1
    return input_ids, attention_mask


def _shared_prompts(samples: Sequence[PolicySample], response_width: int, pad_token_id: int) -> SharedPrompts:
    groups = prompt_groups(samples, range(len(samples)))
    prompt_width = max(samples[g[0]].prompt_length for g in groups)
    prompt_ids = torch.full((len(groups), prompt_width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(groups), prompt_width), dtype=torch.long)
    row_prompt = torch.empty(len(samples), dtype=torch.long)
    for g, members in enumerate(groups):
        prompt = samples[members[0]].prompt_ids
        prompt_ids[g, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[g, : len(prompt)] = 1
        row_prompt[members] = g
    response_ids = torch.full((len(samples), response_width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((len(samples), response_width), dtype=torch.long)
    for i, sample in enumerate(samples):
        response = sample.input_ids[sample.prompt_length :]
        response_ids[i, : len(response)] = torch.tensor(response, dtype=torch.long)
        response_mask[i, : len(response)] = 1
    return SharedPrompts(prompt_ids, prompt_mask, row_prompt, response_ids, response_mask)


def unpad_response(values: torch.Tensor, samples: Sequence[PolicySample]) -> list[list[float]]:
    """Rows of a ``(B, R)`` response-frame tensor cut to each sample's response length."""
    assert values.shape[0] == len(samples), f"{values.shape[0]} rows for {len(samples)} samples"
    rows = values.detach().float().cpu().tolist()
    return [row[: s.response_length] for row, s in zip(rows, samples)]
