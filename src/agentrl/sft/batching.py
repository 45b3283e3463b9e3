"""SFT data: tokenized conversations, the data order, and token-budget micro-batches.

- Every conversation is rendered once with its loss mask (:mod:`agentrl.sft.masking`) and
  right-truncated at ``max_length`` (the recipe's truncation), or refused (``truncation: error``).
- Data order: one seeded permutation per epoch; optimizer step ``s`` takes the ``s``-th slice of
  ``global_batch_size`` conversations (the last partial batch of an epoch is dropped, as upstream's
  sampler does). The order is a pure function of (seed, epoch, step), so a resumed run needs only
  the step number to continue exactly where it stopped.
- Micro-batches: the conversations of one step are sorted longest first and cut into runs of
  similar lengths, each at most ``micro_batch_size`` sequences and ``micro_batch_tokens`` padded
  tokens (rows x longest row). With ``micro_batch_overhead_tokens`` null the runs are filled
  greedily (the fewest micro-batches; at the embedded default, global = micro = 8, the whole step
  is one micro-batch of 25% padding). With a number ``c`` (length grouping) the cut is the one
  that minimises ``padded tokens + c x micro-batches`` (:func:`group_by_length`): a forward of
  fewer rows of closer lengths wastes less on padding, and ``c`` is what one more
  forward/backward costs, in tokens. Either way the step keeps its conversations (the data order
  below is untouched), so only the split changes. The count is then made a multiple of the
  process count (splitting the largest micro-batches) and micro-batches are dealt to processes
  with equal counts (ZeRO-2/3 reduce gradients in every backward, so every process must run the
  same number) and balanced padded tokens. With ``sft.packing`` a micro-batch is one row of its
  conversations end to end (:func:`collate_packed`, :mod:`agentrl.training.packing`), filled
  first-fit to ``micro_batch_size`` conversations and ``micro_batch_tokens`` real tokens, and dealt
  by real tokens. Because the loss is a token sum divided by the whole
  step's trained-token count, how a step is cut into micro-batches or processes changes only the
  speed and the floating-point summation order, never the gradient.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from agentrl.config import ConfigError
from agentrl.data.records import SftExample
from agentrl.errors import DataFormatError
from agentrl.sft.masking import render_with_assistant_mask
from agentrl.training.packing import pack_sequences

log = logging.getLogger("agentrl.sft")


@dataclass(frozen=True)
class TokenizedExample:
    id: str
    input_ids: list[int]
    loss_mask: list[int]  # 1 = trained (assistant) token

    @property
    def trained_targets(self) -> int:
        """Positions whose next-token prediction is trained (token 0 is never a target)."""
        return sum(self.loss_mask[1:])


def aligned_loss_mask(input_ids: list[int], loss_mask: list[int], alignment: str, newline_id: int) -> list[int]:
    """The mask of the prediction *targets* (the trainer weighs the prediction of token t by mask[t]).

    ``target``: the assistant tokens themselves. ``input`` (``sft.loss_mask_alignment``), upstream's
    fsdp_sft_trainer on its multiturn dataset: the dataset's mask u is the assistant span as the
    template renders it, so also the newline after each turn's ``<|im_end|>``; the trainer weighs
    the prediction of token t+1 by ``u[t]`` (``loss_mask[:, :-1]``), i.e. the target mask is
    ``[0] + u[:-1]``. The first token of every assistant turn is not trained; the newline after
    its ``<|im_end|>`` and the token after that newline (the next turn's ``<|im_start|>``) are.
    """
    if alignment == "target":
        return loss_mask
    assert alignment == "input", f"sft.loss_mask_alignment must be 'target' or 'input', got {alignment!r}"
    upstream = list(loss_mask)
    for t in range(1, len(loss_mask)):
        if loss_mask[t - 1] and not loss_mask[t] and input_ids[t] == newline_id:
            upstream[t] = 1
    return [0, *upstream[:-1]]


def tokenize_examples(
    examples: Sequence[SftExample],
    tokenizer,
    max_length: int,
    truncation: str,
    source: str = "sft data",
    loss_mask_alignment: str = "target",
) -> list[TokenizedExample]:
    """Render and mask every conversation; errors name the example (and ``source``)."""
    out: list[TokenizedExample] = []
    truncated = 0
    newline_id = tokenizer.encode("\n", add_special_tokens=False)[-1]
    for row, example in enumerate(examples):
        try:
            input_ids, loss_mask = render_with_assistant_mask(tokenizer, example.messages, example.tools)
        except (ValueError, TypeError, KeyError) as exc:
            raise DataFormatError(f"{source}: row {row} (id {example.id!r}): {exc}") from None
        if len(input_ids) > max_length:
            if truncation == "error":
                raise DataFormatError(
                    f"{source}: row {row} (id {example.id!r}) has {len(input_ids)} tokens, more "
                    f"than sft.max_length={max_length} (sft.truncation: error)"
                )
            input_ids, loss_mask = input_ids[:max_length], loss_mask[:max_length]
            truncated += 1
        loss_mask = aligned_loss_mask(input_ids, loss_mask, loss_mask_alignment, newline_id)
        out.append(TokenizedExample(example.id, input_ids, loss_mask))
    if truncated:
        log.warning("%d of %d conversations right-truncated to %d tokens", truncated, len(out), max_length)
    empty = sum(1 for e in out if e.trained_targets == 0)
    if empty:
        log.warning("%d conversations have no trained token (after truncation); they add nothing", empty)
    return out


def check_trained_tokens(examples: Sequence[TokenizedExample], source: str) -> None:
    """Raise DataFormatError when no example has a trained token: the run would save its base model
    as if trained (an SFT set without assistant turns, or every one cut off by ``sft.max_length``)."""
    if not any(e.trained_targets for e in examples):
        raise DataFormatError(
            f"{source}: none of the {len(examples)} conversations has a trained token (an assistant turn "
            "within sft.max_length); SFT would save an untrained model"
        )


def steps_per_epoch(num_examples: int, global_batch_size: int) -> int:
    steps = num_examples // global_batch_size
    if steps == 0:
        raise ConfigError(
            f"sft.global_batch_size={global_batch_size} is larger than the data set "
            f"({num_examples} conversations): not one optimizer step fits"
        )
    return steps


def step_indices(step: int, num_examples: int, global_batch_size: int, seed: int) -> list[int]:
    """Example indices of optimizer step ``step`` (0-based, counted across epochs)."""
    per_epoch = steps_per_epoch(num_examples, global_batch_size)
    epoch, position = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(num_examples)
    return [int(i) for i in order[position * global_batch_size : (position + 1) * global_batch_size]]


def _padded_cost(batch: list[int], lengths: Sequence[int]) -> int:
    return len(batch) * max(lengths[i] for i in batch)


def _packed_cost(batch: list[int], lengths: Sequence[int]) -> int:
    return sum(lengths[i] for i in batch)


def _fill_packed(lengths: Sequence[int], micro_batch_size: int, micro_batch_tokens: int | None) -> list[list[int]]:
    """First-fit decreasing into micro-batches of at most ``micro_batch_size`` sequences and
    ``micro_batch_tokens`` tokens (packed: no padding, so the fewest micro-batches are best)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for index in order:
        for batch in batches:
            tokens = _packed_cost(batch, lengths) + lengths[index]
            if len(batch) < micro_batch_size and (micro_batch_tokens is None or tokens <= micro_batch_tokens):
                batch.append(index)
                break
        else:
            batches.append([index])
    return batches


def _fits(size: int, longest: int, micro_batch_size: int, micro_batch_tokens: int | None) -> bool:
    """Whether ``size`` rows led by a ``longest``-token row may form a micro-batch (one row always may)."""
    if size == 1:
        return True
    return size <= micro_batch_size and (micro_batch_tokens is None or size * longest <= micro_batch_tokens)


def group_by_length(
    lengths: Sequence[int], micro_batch_size: int, micro_batch_tokens: int | None, overhead_tokens: int
) -> list[list[int]]:
    """The cut of the length-sorted sequences into micro-batches of least ``padded + overhead x count``.

    With ``l_0 >= l_1 >= ...`` sorted longest first, a micro-batch of rows ``i..j-1`` costs
    ``(j - i) * l_i + overhead`` (padded tokens: every row is as wide as the first); the best
    cut of the first ``j`` rows is ``f(j) = min_i f(i) + (j - i) * l_i + overhead`` over the
    ``i`` whose micro-batch fits (``micro_batch_size`` rows, ``micro_batch_tokens`` padded
    tokens). Contiguous runs of the sorted order are optimal: giving the micro-batch of the
    longest row the next-longest rows keeps its width and narrows no other (nor breaks a limit).
    Ties go to fewer micro-batches, then to the earlier cut.
    """
    assert overhead_tokens >= 0, f"overhead_tokens must be >= 0, got {overhead_tokens}"
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    sorted_lengths = [lengths[i] for i in order]
    best: list[tuple[int, int]] = [(0, 0)]  # f(j) as (cost, micro-batches)
    cut_at: list[int] = [0]
    for end in range(1, len(order) + 1):
        candidates = [
            ((best[start][0] + (end - start) * sorted_lengths[start] + overhead_tokens, best[start][1] + 1), start)
            for start in range(end)
            if _fits(end - start, sorted_lengths[start], micro_batch_size, micro_batch_tokens)
        ]
        cost, start = min(candidates)
        best.append(cost)
        cut_at.append(start)
    batches: list[list[int]] = []
    end = len(order)
    while end:
        batches.append(order[cut_at[end] : end])
        end = cut_at[end]
    return batches[::-1]


def _fill_greedily(lengths: Sequence[int], micro_batch_size: int, micro_batch_tokens: int | None) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for index in order:
        current = batches[-1] if batches else None
        fits = (
            current is not None
            and len(current) < micro_batch_size
            and (micro_batch_tokens is None or (len(current) + 1) * lengths[current[0]] <= micro_batch_tokens)
        )
        if fits:
            current.append(index)
        else:
            batches.append([index])
    return batches


def pack_micro_batches(
    lengths: Sequence[int],
    micro_batch_size: int,
    micro_batch_tokens: int | None,
    num_ranks: int,
    overhead_tokens: int | None = None,
    packed: bool = False,
) -> list[list[list[int]]]:
    """Split one step's sequences (given by their lengths) into micro-batches, per rank.

    Returns ``per_rank[r] = [micro_batch, ...]``, each micro-batch a list of positions into
    ``lengths``. Every rank gets the same number of micro-batches; every position appears once.
    ``overhead_tokens`` (``sft.micro_batch_overhead_tokens``): None fills micro-batches greedily,
    a number groups by length (:func:`group_by_length`). ``packed`` (``sft.packing``): the
    micro-batches are packed rows (:func:`collate_packed`), ``micro_batch_tokens`` counts real
    tokens and they are filled first-fit (no padding to group against; ``overhead_tokens`` unused).
    """
    assert micro_batch_size >= 1 and num_ranks >= 1, "micro_batch_size and num_ranks must be >= 1"
    if len(lengths) % num_ranks:
        raise ConfigError(
            f"{len(lengths)} sequences per step cannot be split over {num_ranks} processes; "
            "make sft.global_batch_size a multiple of the process count"
        )
    cost = _packed_cost if packed else _padded_cost
    if packed:
        batches = _fill_packed(lengths, micro_batch_size, micro_batch_tokens)
    elif overhead_tokens is None:
        batches = _fill_greedily(lengths, micro_batch_size, micro_batch_tokens)
    else:
        batches = group_by_length(lengths, micro_batch_size, micro_batch_tokens, overhead_tokens)
    while len(batches) % num_ranks:
        splittable = [b for b in batches if len(b) > 1]
        assert splittable, "cannot happen: there are at least num_ranks sequences"
        largest = max(splittable, key=lambda b: (cost(b, lengths), len(b)))
        half = len(largest) // 2
        batches.remove(largest)
        batches += [largest[:half], largest[half:]]
    per_rank: list[list[list[int]]] = [[] for _ in range(num_ranks)]
    loads = [0] * num_ranks
    quota = len(batches) // num_ranks
    for batch in sorted(batches, key=lambda b: (-cost(b, lengths), b[0])):
        open_ranks = [r for r in range(num_ranks) if len(per_rank[r]) < quota]
        rank = min(open_ranks, key=lambda r: (loads[r], r))
        per_rank[rank].append(batch)
        loads[rank] += cost(batch, lengths)
    return per_rank


def collate(examples: Sequence[TokenizedExample], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors: input_ids, attention_mask and loss_mask, each (B, T_max)."""
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        input_ids[row, :n] = torch.tensor(example.input_ids, dtype=torch.long)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(example.loss_mask, dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}


def collate_packed(examples: Sequence[TokenizedExample]) -> dict:
    """The conversations end to end in one row (:class:`~agentrl.training.packing.PackedRow`):
    input_ids and loss_mask ``(1, T)``, attention_mask None, and ``packed``.

    A sequence's first token is never a target (nothing of its own precedes it), so its mask is 0:
    otherwise the previous conversation's last position would be trained to predict it.
    """
    row = pack_sequences([e.input_ids for e in examples])
    loss_mask = torch.tensor([m for e in examples for m in e.loss_mask], dtype=torch.long)[None]
    loss_mask[0, row.starts] = 0
    return {"input_ids": row.input_ids, "attention_mask": None, "loss_mask": loss_mask, "packed": row}
