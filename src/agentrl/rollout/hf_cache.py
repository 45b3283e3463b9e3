"""The hf engine's decode machinery on top of transformers: a KV cache that grows in place, and
grouped-query attention without copies on CPU.

Both remove a copy of the whole KV cache per layer and generated token that transformers makes
(measured on the embedded model, batch 64 at about 800 cached tokens, one thread; the agent loop
at ``c68a46b`` and at ``6486aba``, with ``benchmarks/loop_ab.py``: docs/results.md, "the agent
loop at c68a46b and at 6486aba"):

- ``DynamicLayer.update`` appends with ``torch.cat``, which copies the layer's keys and values
  every step. :class:`GrowingLayer` writes into a buffer with spare room (doubled when full) and
  hands attention a view of its filled part; scaled-dot-product attention reads the strided
  view at the same speed as a contiguous tensor.
- transformers' ``sdpa`` attention expands the key/value heads to the query heads
  (``repeat_kv``) whenever a mask is given, because the CUDA kernels fall back to the math
  kernel for masked GQA. On CPU, ``enable_gqa=True`` gives the same numbers without the copy
  (13x faster for a decode step there). :func:`use_cpu_gqa_attention` registers that variant and
  selects it for a CPU model; everything else (CUDA, training with gradients) keeps transformers'
  own function.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "agentrl_cpu_gqa_sdpa"


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views into a buffer with spare room."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer = self._value_buffer = None
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        added = key_states.shape[-2]
        needed = self.length + added
        if (
            self._key_buffer is None
            or needed > self._key_buffer.shape[-2]
            or (self._key_buffer.shape[0] != key_states.shape[0])
        ):
            capacity = max(2 * needed, needed + 64)
            self._key_buffer = self._grown(self._key_buffer, key_states, capacity)
            self._value_buffer = self._grown(self._value_buffer, value_states, capacity)
        self._key_buffer[:, :, self.length : needed] = key_states
        self._value_buffer[:, :, self.length : needed] = value_states
        self.length = needed
        self.keys = self._key_buffer[:, :, :needed]
        self.values = self._value_buffer[:, :, :needed]
        return self.keys, self.values

    def _grown(self, buffer: torch.Tensor | None, states: torch.Tensor, capacity: int) -> torch.Tensor:
        shape = (states.shape[0], states.shape[1], capacity, states.shape[3])
        grown = states.new_empty(shape)
        if buffer is not None and self.length:
            grown[:, :, : self.length] = buffer[:, :, : self.length]
        return grown

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized and self.length:
            self._key_buffer = self._selected(self._key_buffer, indices)
            self._value_buffer = self._selected(self._value_buffer, indices)
            self.keys = self._key_buffer[:, :, : self.length]
            self.values = self._value_buffer[:, :, : self.length]

    def _selected(self, buffer: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The rows ``indices`` of ``buffer``, same spare room, only the filled part copied."""
        selected = buffer.new_empty((len(indices), *buffer.shape[1:]))
        selected[:, :, : self.length] = buffer[indices, :, : self.length]
        return selected


def batch_cache(layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None, *, num_layers: int) -> Cache:
    """A cache of :class:`GrowingLayer`, filled with ``layers`` (per layer (B, heads, T, dim) keys, values)."""
    cache = Cache(layers=[GrowingLayer() for _ in range(num_layers)])
    for index, (keys, values) in enumerate(layers or []):
        cache.layers[index].update(keys, values)
    return cache


def cached_layers(cache: Cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the cached (keys, values), each (B, heads, T, dim)."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def _cpu_gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' sdpa attention, but grouped-query heads are not copied on CPU without gradients."""
    groups = getattr(module, "num_key_value_groups", 1)
    if query.device.type != "cpu" or torch.is_grad_enabled() or groups == 1 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=query.shape[2] > 1 and attention_mask is None and causal,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def use_cpu_gqa_attention(model: torch.nn.Module) -> None:
    """Select :func:`_cpu_gqa_sdpa` for a CPU model that uses transformers' ``sdpa`` attention."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return
    if next(model.parameters()).device.type != "cpu":
        return
    AttentionInterface.register(ATTENTION, _cpu_gqa_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    model.set_attn_implementation(ATTENTION)
