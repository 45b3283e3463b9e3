"""From trajectories to training tensors: samples, micro-batches by token budget, padding.

A :class:`PolicySample` is one trajectory as the update sees it: the token ids ``prompt +
response`` and, over the response positions only, the loss mask (1 on sampled tokens, 0 on
tool responses and template tokens inserted by the agent loop), the sampling log-probs, the
log-probs recomputed by the actor before the update (``old_logp``), the reference model's (for
the KL variants) and the sequence's advantage.

Tensors of a micro-batch live in the *response frame* ``(B, R)``: column k of row i is response
token k of sample i, predicted by the hidden state at position ``prompt_len_i - 1 + k`` of the
right-padded ``(B, L)`` input. Positions past a sample's response are padding with loss mask 0.

Micro-batches are packed to a budget of padded tokens (``grpo.micro_batch_tokens``): samples
sorted longest first, each micro-batch filled while ``rows * longest <= budget``, so a forward
never holds more than the budget and short sequences share a forward. A sample longer than the
budget gets a micro-batch of its own (it cannot be split). The loss of a micro-batch is divided
by the *mini-batch's* token (or sequence) count, so packing changes no gradient
(``algorithm.aggregate_loss``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentrl.data.records import Trajectory


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


@dataclass
class MicroBatch:
    """Padded tensors of a few samples; ``(B, L)`` inputs and ``(B, R)`` response-frame values."""

    input_ids: torch.Tensor  # (B, L) right-padded
    attention_mask: torch.Tensor  # (B, L)
    response_start: torch.Tensor  # (B,) prompt length: first response position
    response_length: torch.Tensor  # (B,)
    loss_mask: torch.Tensor  # (B, R)
    advantages: torch.Tensor  # (B, R), the sequence advantage on every loss token
    sampling_logp: torch.Tensor  # (B, R)
    old_logp: torch.Tensor | None  # (B, R)
    ref_logp: torch.Tensor | None  # (B, R)

    @property
    def num_tokens(self) -> int:
        """Padded tokens of the forward."""
        return int(self.input_ids.numel())

    def to(self, device: torch.device | str) -> MicroBatch:
        moved = {
            name: (value.to(device) if isinstance(value, torch.Tensor) else value)
            for name, value in self.__dict__.items()
        }
        return MicroBatch(**moved)


def _response_frame(rows: Sequence[Sequence[float]], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def collate(samples: Sequence[PolicySample], pad_token_id: int) -> MicroBatch:
    """Right-pad ``samples`` into a :class:`MicroBatch` (on the CPU)."""
    assert samples, "cannot collate an empty micro-batch"
    width = max(len(s.input_ids) for s in samples)
    response_width = max(s.response_length for s in samples)
    input_ids = torch.full((len(samples), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(samples), width), dtype=torch.long)
    for i, sample in enumerate(samples):
        input_ids[i, : len(sample.input_ids)] = torch.tensor(sample.input_ids, dtype=torch.long)
        attention_mask[i, : len(sample.input_ids)] = 1
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
    )


def unpad_response(values: torch.Tensor, samples: Sequence[PolicySample]) -> list[list[float]]:
    """Rows of a ``(B, R)`` response-frame tensor cut to each sample's response length."""
    assert values.shape[0] == len(samples), f"{values.shape[0]} rows for {len(samples)} samples"
    rows = values.detach().float().cpu().tolist()
    return [row[: s.response_length] for row, s in zip(rows, samples)]
