"""Padding-free (packed) forwards: several sequences in one row, no attention across them.

A packed micro-batch is one row of the sequences end to end, with per-sequence positions
(``position_ids`` restart at 0 at each sequence) and the cumulative segment lengths
``cu_seqlens = [0, L_0, L_0 + L_1, ...]``. Token t of sequence i attends to its own sequence's
tokens up to t only (block-diagonal causal attention), so each sequence's hidden states are those
of its own unpadded forward, and no position is computed for padding.

Sequences that begin with the same prefix (a GRPO group's prompt: :func:`pack_sequences`'
``prefix_lengths``) compute it once: the first holds it, each other one only the prefix's last
token and its own tokens, and attends to the first one's prefix positions, then its own
(:class:`SharedKeys`; causal from the bottom right). A prompt of P tokens shared by n samples
costs ``P + n - 1`` positions instead of ``n P``. A GRPO step at 8 prompts x 8 samples of ~40
prompt and ~30 response tokens: packed without it computed 4,683 positions against
``share_prompts``' 4,448 (its responses padded) and took 1.02-1.18x its CPU time per round (1.28x
before the slicing fix in :func:`_per_sequence_sdpa`); with it 2,527 positions and 0.63x, and
0.45x at the embedded default's lengths (``benchmarks/packing.py --shapes short embedded``).

transformers 5.19 has two packed paths: flash-attention varlen (``flash_attention_*``, which
needs the flash-attn package) reads ``cu_seq_lens_q``; SDPA and eager detect packing from the
``position_ids`` resets (``masking_utils.find_packed_sequence_indices``) and build a dense
``(1, 1, T, T)`` block-diagonal mask. :func:`enable_packed_attention` registers a third,
``agentrl_packed_<X>`` over the model's attention X: X for every unpacked call (the ``hf`` rollout
engine shares the actor's module and decodes with its own CPU attention), and for a packed call
the attention of each segment on its own: torch's varlen flash kernel
(``torch.nn.attention.varlen``, no extra dependency) on CUDA in bf16/fp16, else SDPA per segment
(CPU: exact to 2e-6 against the padded forward).

Why SDPA per segment on CPU and not one call per micro-batch: one layer's attention, forward and
backward, the embedded model's heads (4 query, 2 key/value, 32 wide), one thread, torch 2.13 on a
loaded 2-core machine, in ms, per segment / one call with the dense block-diagonal ``T x T``
mask / one call over the sequences padded to a ``(S, H, L_max, D)`` batch: 8 sequences of 30-90
tokens (T = 508) 7.5 / 22 / 16; 4 of 200-600 (T = 1,471) 57 / 186 / 93; 16 of 100-200 (T =
2,231) 36 / 479 / 69; 64 of 60-90 (T = 4,619) 51 / 1,961 / 78; 64 of 150-700 (T = 27,037) 908 /
- / 2,449. The dense mask does ``T^2`` work where the segments do ``sum L_i^2`` (and holds a 1-GB
mask at a 32K row), and lost at every row length tried, so there is no threshold under which one
call is used. Flex attention has no backward on CPU (torch 2.13), nested (jagged) tensors no CPU
SDPA kernel with ``is_causal``. The per-segment loop's cost was its slicing, not its calls (see
:func:`_per_sequence_sdpa`: 158 ms sliced at T = 4,619).

transformers' own detection is also skipped whenever the decoder is handed or makes a cache
(``use_cache`` defaults to true in eval mode), and the sequences then silently attend to each
other. The packed call passes an all-ones 2-D attention mask, so transformers' mask builder skips
the dense mask (``_ignore_causal_mask_sdpa``), and ``cu_seq_lens_q`` (with the shared prefixes'
``cu_seq_lens_k`` and :data:`KEY_INDEX`) reaches the attention function through the layers'
keyword arguments (also when a checkpointed layer is recomputed in backward).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

ATTENTION = "agentrl_packed"
FLASH_DTYPES = (torch.float16, torch.bfloat16)  # torch's varlen flash kernel takes these


KEY_INDEX = "agentrl_key_index"  # the packed call's keyword argument for SharedKeys.index


@dataclass
class SharedKeys:
    """Where the keys of a row's segments are: segment i attends to the row positions
    ``index[cu_seqlens[i]:cu_seqlens[i + 1]]``, in that order, its own last (causal from the
    bottom right: the segment's query t sees all keys but its own segment's tokens after t)."""

    index: torch.Tensor  # (T_k,) long
    cu_seqlens: torch.Tensor  # (S + 1,) int32
    max_length: int

    def to(self, device: torch.device | str) -> SharedKeys:
        return SharedKeys(self.index.to(device), self.cu_seqlens.to(device), self.max_length)


@dataclass
class PackedRow:
    """Sequences end to end in one row: ``input_ids`` and ``position_ids`` ``(1, T)``,
    ``cu_seqlens`` ``(S + 1,)`` int32 (segment i is ``cu_seqlens[i]:cu_seqlens[i + 1]``), and
    ``starts`` ``(S,)``: token t of sequence i is at row position ``starts[i] + t``.

    With ``keys`` (:func:`pack_sequences` with shared prefixes) a segment may hold only the end
    of its sequence: the tokens before it are another segment's (a shared prompt), ``starts[i]``
    is then before the segment, and its keys are those ``keys`` names."""

    input_ids: torch.Tensor  # (1, T)
    position_ids: torch.Tensor  # (1, T)
    cu_seqlens: torch.Tensor  # (S + 1,) int32
    max_length: int
    starts: torch.Tensor  # (S,) long
    keys: SharedKeys | None = None

    @property
    def lengths(self) -> torch.Tensor:
        """``(S,)`` the segments' lengths in the row."""
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).long()

    def model_inputs(self) -> dict:
        """Keyword arguments of a Hugging Face decoder's forward for this row."""
        inputs = {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            # all ones: transformers then builds no dense mask (the sequences' boundaries are in cu_seq_lens)
            "attention_mask": torch.ones_like(self.input_ids),
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
            "use_cache": False,
        }
        if self.keys is not None:
            inputs.update(
                {
                    "cu_seq_lens_k": self.keys.cu_seqlens,
                    "max_length_k": self.keys.max_length,
                    KEY_INDEX: self.keys.index,
                }
            )
        return inputs

    def to(self, device: torch.device | str) -> PackedRow:
        moved = [self.input_ids, self.position_ids, self.cu_seqlens]
        keys = self.keys.to(device) if self.keys is not None else None
        return PackedRow(*(t.to(device) for t in moved), self.max_length, self.starts.to(device), keys)


def pack_sequences(sequences: Sequence[Sequence[int]], prefix_lengths: Sequence[int] | None = None) -> PackedRow:
    """``sequences`` (token ids, each non-empty) end to end in one :class:`PackedRow`.

    With ``prefix_lengths``, sequences that begin with the same prefix (their first
    ``prefix_lengths[i]`` tokens: a GRPO group's prompt) compute it once: the first of them holds
    it whole, each other one only its last token (whose hidden state predicts the first token
    after it) and its own tokens, attending to the first one's prefix positions, then its own.
    Each token then sees the keys and positions of its own sequence's forward, and a prompt of P
    tokens shared by n sequences costs P + n - 1 positions, not n P.
    """
    assert sequences and all(sequences), "cannot pack an empty sequence or none"
    prefix_lengths = [0] * len(sequences) if prefix_lengths is None else list(prefix_lengths)
    assert len(prefix_lengths) == len(sequences), f"{len(prefix_lengths)} prefix lengths, {len(sequences)} sequences"
    holders: dict[tuple[int, ...], int] = {}  # a prefix -> the row position of its first token
    tokens, positions, starts, segments, keys, key_lengths = [], [], [], [], [], []
    for sequence, prefix in zip(sequences, prefix_lengths):
        assert 0 <= prefix <= len(sequence), f"prefix of {prefix} tokens in a sequence of {len(sequence)}"
        start, key = len(tokens), tuple(sequence[:prefix])
        held = holders.get(key) if prefix > 1 else None
        skipped = 0 if held is None else prefix - 1  # leading tokens another segment holds
        if held is None and prefix > 1:
            holders[key] = start
        own = range(start, start + len(sequence) - skipped)
        keys.extend([*range(held, held + skipped), *own] if held is not None else own)
        key_lengths.append(len(own) + skipped)
        tokens.extend(sequence[skipped:])
        positions.extend(range(skipped, len(sequence)))
        starts.append(start - skipped)
        segments.append(len(own))
    row = PackedRow(
        torch.tensor(tokens, dtype=torch.long)[None],
        torch.tensor(positions, dtype=torch.long)[None],
        _cumulative(segments),
        max(segments),
        torch.tensor(starts, dtype=torch.long),
    )
    if key_lengths != segments:
        row.keys = SharedKeys(torch.tensor(keys, dtype=torch.long), _cumulative(key_lengths), max(key_lengths))
    return row


def _cumulative(lengths: list[int]) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return out


def _per_sequence_sdpa(query, key, value, cu_seqlens: torch.Tensor, scaling, cu_seqlens_k=None) -> torch.Tensor:
    """``(1, H, T, D)`` (key and value ``(1, H_kv, T_k, D)``) -> ``(1, T, H, D)``: causal SDPA on
    each segment of the row apart; a segment with more keys (``cu_seqlens_k``: a shared prefix's
    before its own) attends causally from the bottom right, as flash does.

    The row is cut by ``split``, not by slicing: a slice's backward writes its gradient into a
    zero-filled tensor of the whole row, so S slices of q, k and v cost O(S * T) fills and adds per
    layer (on 64 sequences of ~70 tokens, a third of the packed GRPO step went there), while
    ``split``'s backward is one concatenation. Key and value heads are shared by SDPA's
    ``enable_gqa`` (bitwise the same as repeating them, without the copies).
    """
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    key_lengths = lengths if cu_seqlens_k is None else (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).tolist()
    gqa = query.shape[1] != key.shape[1]
    outputs = []
    for q, k, v in zip(query.split(lengths, 2), key.split(key_lengths, 2), value.split(key_lengths, 2)):
        rows, columns = q.shape[2], k.shape[2]
        causal = {"is_causal": True}
        if rows != columns:
            causal = {"attn_mask": torch.ones(rows, columns, dtype=torch.bool, device=q.device).tril(columns - rows)}
        outputs.append(
            torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scaling, enable_gqa=gqa, **causal)
        )
    return torch.cat(outputs, dim=2).transpose(1, 2)


@functools.cache
def _keywords(function) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def _varlen_flash(query, key, value, cu_seqlens: torch.Tensor, max_length: int, scaling, keys=None) -> torch.Tensor:
    """``(1, H, T, D)`` (key and value ``(1, H_kv, T_k, D)``) -> ``(1, T, H, D)`` by torch's varlen
    flash kernel (``torch.nn.attention.varlen.varlen_attn``; CUDA, 16-bit). ``keys``:
    ``(cu_seqlens_k, max_length_k)`` where the key segments are not the query segments (flash's
    causal mask is aligned at the bottom right, what a segment after a shared prefix needs).

    Grouped-query attention: torch 2.13's ``varlen_attn`` shares the key and value heads itself
    (``enable_gqa``); torch 2.11's has no such keyword and takes one head count for all three, so
    the heads are repeated for it, as transformers' SDPA path does. Which one is read from the
    function's signature (a version string would not tell a nightly or a backport).
    """
    from torch.nn.attention.varlen import varlen_attn

    options = {"scale": scaling, "window_size": (-1, 0)}  # (-1, 0): causal
    groups = query.shape[1] // key.shape[1]
    if groups > 1 and "enable_gqa" in _keywords(varlen_attn):
        options["enable_gqa"] = True
    elif groups > 1:
        from transformers.integrations.sdpa_attention import repeat_kv

        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))  # (T, H, D), as flash lays them out
    cu_seqlens_k, max_length_k = (cu_seqlens, max_length) if keys is None else keys
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens_k, max_length, max_length_k, **options)[None]


def packed_attention_forward(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, *, unpacked, **kwargs
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``unpacked`` (the model's own attention function) unless
    the call carries ``cu_seq_lens_q`` (a packed row)."""
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:
        return unpacked(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    assert query.shape[0] == 1, f"a packed call has one row, got {query.shape[0]}"
    assert dropout == 0.0 or not module.training, "packed attention has no dropout"
    return _packed_attention(query, key, value, scaling, kwargs, query.is_cuda and query.dtype in FLASH_DTYPES), None


def _packed_attention(query, key, value, scaling, kwargs: dict, flash: bool) -> torch.Tensor:
    """A packed row's attention from the forward's keyword arguments (:meth:`PackedRow.model_inputs`):
    torch's varlen flash kernel (``flash``) or SDPA per segment."""
    cu_seqlens, key_index = kwargs["cu_seq_lens_q"], kwargs.get(KEY_INDEX)
    keys, cu_seqlens_k = None, None
    if key_index is not None:  # segments after a shared prefix: their keys gathered, the prefix's first
        key, value = key.index_select(2, key_index), value.index_select(2, key_index)
        cu_seqlens_k = kwargs["cu_seq_lens_k"]
        keys = (cu_seqlens_k.to(torch.int32), int(kwargs["max_length_k"]))
    if flash:
        max_length = int(kwargs["max_length_q"])
        return _varlen_flash(query, key, value, cu_seqlens.to(torch.int32), max_length, scaling, keys)
    return _per_sequence_sdpa(query, key, value, cu_seqlens, scaling, cu_seqlens_k)


def enable_packed_attention(model: torch.nn.Module) -> None:
    """Give ``model`` the packed attention over its current one, which keeps computing every
    unpacked call (the ``hf`` engine's decode, with its own CPU attention, shares the module).

    A flash-attention model is wrapped too: transformers' own varlen call reads ``cu_seq_lens``
    but not a row's shared prefixes (:class:`SharedKeys`). The packed variant of attention
    ``X`` is registered as ``agentrl_packed_X``, with ``X``'s mask function (SDPA's for eager,
    which has neither in transformers' registries and computes as SDPA does).
    """
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    current = model.config._attn_implementation
    if current.startswith(ATTENTION):
        return
    attention, masks = AttentionInterface(), AttentionMaskInterface()
    unpacked = attention[current] if current in attention else sdpa_attention_forward
    name = f"{ATTENTION}_{current}"
    AttentionInterface.register(name, functools.partial(packed_attention_forward, unpacked=unpacked))
    AttentionMaskInterface.register(name, masks[current] if current in masks else sdpa_mask)
    model.set_attn_implementation(name)
