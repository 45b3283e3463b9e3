"""Padding-free (packed) forwards: several sequences in one row, no attention across them.

A packed micro-batch is one row of ``T = sum_i L_i`` tokens, the sequences end to end, with
per-sequence positions (``position_ids`` restart at 0 at each sequence) and the cumulative
lengths ``cu_seqlens = [0, L_0, L_0 + L_1, ...]``. Token t of sequence i attends to tokens
``cu_seqlens[i] .. t`` only (block-diagonal causal attention), so each sequence's hidden states
are those of its own unpadded forward, and no position is computed for padding.

transformers 5.19 has two packed paths: flash-attention varlen (``flash_attention_*``, which
needs the flash-attn package) reads ``cu_seq_lens_q``; SDPA and eager detect packing from the
``position_ids`` resets (``masking_utils.find_packed_sequence_indices``) and build a dense
``(1, 1, T, T)`` block-diagonal mask, i.e. attention over the whole ``T x T`` square (a 32K-token
row: a 1-GB mask and ~``T / L`` times the attention work of the sequences apart).
:func:`enable_packed_attention` registers a third, ``agentrl_packed_<X>`` over the model's
attention X: X for every unpacked call (the ``hf`` rollout engine shares the actor's module and
decodes with its own CPU attention), and for a packed call the attention of each sequence on its
own: torch's varlen flash kernel (``torch.nn.attention.varlen``, no extra dependency) on
CUDA in bf16/fp16, else SDPA with ``is_causal`` per sequence (CPU: exact to 2e-6 against the
padded forward; on the embedded model's shape, 24 sequences of 60-700 tokens, forward and
backward in one thread took 3.0 s, against 9.5 s with the dense mask and 7.7-9.4 s padded, an
ad-hoc measurement on a loaded machine). transformers' detection is also skipped whenever the
decoder is handed or makes a cache (``use_cache`` defaults to true in eval mode), and the
sequences then silently attend to each other. The packed call passes an all-ones 2-D attention mask,
so transformers' mask builder skips the dense mask (``_ignore_causal_mask_sdpa``), and
``cu_seq_lens_q`` reaches the attention function through the layers' keyword arguments (also
when a checkpointed layer is recomputed in backward).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

ATTENTION = "agentrl_packed"


@dataclass
class PackedRow:
    """Sequences end to end in one row: ``input_ids`` and ``position_ids`` ``(1, T)``,
    ``cu_seqlens`` ``(S + 1,)`` int32 (sequence i is ``cu_seqlens[i]:cu_seqlens[i + 1]``)."""

    input_ids: torch.Tensor  # (1, T)
    position_ids: torch.Tensor  # (1, T)
    cu_seqlens: torch.Tensor  # (S + 1,) int32
    max_length: int

    @property
    def starts(self) -> torch.Tensor:
        """``(S,)`` the first position of each sequence in the row."""
        return self.cu_seqlens[:-1].long()

    @property
    def lengths(self) -> torch.Tensor:
        """``(S,)``"""
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).long()

    def model_inputs(self) -> dict:
        """Keyword arguments of a Hugging Face decoder's forward for this row."""
        return {
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

    def to(self, device: torch.device | str) -> PackedRow:
        return PackedRow(
            self.input_ids.to(device), self.position_ids.to(device), self.cu_seqlens.to(device), self.max_length
        )


def pack_sequences(sequences: Sequence[Sequence[int]]) -> PackedRow:
    """``sequences`` (token ids, each non-empty) end to end in one :class:`PackedRow`."""
    assert sequences and all(sequences), "cannot pack an empty sequence or none"
    lengths = [len(s) for s in sequences]
    input_ids = torch.tensor([t for s in sequences for t in s], dtype=torch.long)[None]
    position_ids = torch.cat([torch.arange(n, dtype=torch.long) for n in lengths])[None]
    cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return PackedRow(input_ids, position_ids, cu_seqlens, max(lengths))


def _per_sequence_sdpa(query, key, value, cu_seqlens: torch.Tensor, scaling) -> torch.Tensor:
    """``(1, H, T, D)`` (key and value ``(1, H_kv, T, D)``) -> ``(1, T, H, D)``: causal SDPA on
    each sequence of the row apart.

    The row is cut by ``split``, not by slicing: a slice's backward writes its gradient into a
    zero-filled tensor of the whole row, so S slices of q, k and v cost O(S * T) fills and adds per
    layer (on 64 sequences of ~70 tokens, a third of the packed GRPO step went there), while
    ``split``'s backward is one concatenation. Key and value heads are shared by SDPA's
    ``enable_gqa`` (bitwise the same as repeating them, without the copies).
    """
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    gqa = query.shape[1] != key.shape[1]
    outputs = [
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa)
        for q, k, v in zip(query.split(lengths, 2), key.split(lengths, 2), value.split(lengths, 2))
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2)


@functools.cache
def _keywords(function) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def _varlen_flash(query, key, value, cu_seqlens: torch.Tensor, max_length: int, scaling) -> torch.Tensor:
    """``(1, H, T, D)`` (key and value ``(1, H_kv, T, D)``) -> ``(1, T, H, D)`` by torch's varlen
    flash kernel (``torch.nn.attention.varlen.varlen_attn``; CUDA, 16-bit).

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
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_length, max_length, **options)[None]


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
    if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16):
        return _varlen_flash(query, key, value, cu_seqlens.to(torch.int32), int(kwargs["max_length_q"]), scaling), None
    return _per_sequence_sdpa(query, key, value, cu_seqlens, scaling), None


def enable_packed_attention(model: torch.nn.Module) -> None:
    """Give ``model`` the packed attention over its current one, which keeps computing every
    unpacked call (the ``hf`` engine's decode, with its own CPU attention, shares the module).

    A flash-attention model packs natively and is left as is. The packed variant of attention
    ``X`` is registered as ``agentrl_packed_X``, with ``X``'s mask function (SDPA's for eager,
    which has neither in transformers' registries and computes as SDPA does).
    """
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    current = model.config._attn_implementation
    if current.startswith("flash_attention") or current.startswith(ATTENTION):
        return
    attention, masks = AttentionInterface(), AttentionMaskInterface()
    unpacked = attention[current] if current in attention else sdpa_attention_forward
    name = f"{ATTENTION}_{current}"
    AttentionInterface.register(name, functools.partial(packed_attention_forward, unpacked=unpacked))
    AttentionMaskInterface.register(name, masks[current] if current in masks else sdpa_mask)
    model.set_attn_implementation(name)
