"""The packed attention's CUDA branch (torch's varlen flash kernel) against the varlen_attn of
each torch version it meets: 2.11.0 (the lent GPU machine's; no ``enable_gqa``) and the
installed one. torch's own ``varlen.py`` of that version runs, its flash calls replaced by a CPU
kernel (helpers.torch_varlen), so the arguments the CUDA branch builds are checked by that
version's signature, checks and autograd; the result must equal the CPU branch's attention."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.attention.varlen
from helpers.torch_varlen import TORCH_2_11_VARLEN, installed_varlen_file, load_varlen

from agentrl.training import packing

VARLEN_FILES = {"torch-2.11.0": TORCH_2_11_VARLEN, "installed": installed_varlen_file()}


def _row(heads: int, kv_heads: int, lengths: list[int], head_dim: int = 8):
    """query ``(1, H, T, D)`` and key, value ``(1, H_kv, T, D)``, laid out as transformers hands
    them to an attention function (transposed views of ``(1, T, H, D)``), and ``cu_seqlens``."""
    generator = torch.Generator().manual_seed(sum(lengths) + heads)
    total = sum(lengths)
    tensors = [
        torch.randn(1, total, n, head_dim, generator=generator, dtype=torch.float64).transpose(1, 2).requires_grad_()
        for n in (heads, kv_heads, kv_heads)
    ]
    cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.tensor(lengths).cumsum(0)
    return tensors, cu_seqlens


def _attend(attention, tensors, cu_seqlens, *args):
    out = attention(*tensors, cu_seqlens, *args)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    grads = torch.autograd.grad((out * weights).sum(), tensors)
    return out.detach(), grads


def test_the_fixture_is_torch_2_11s_varlen_attn_without_enable_gqa():
    parameters = inspect.signature(load_varlen(TORCH_2_11_VARLEN).varlen_attn).parameters
    assert "window_size" in parameters and "enable_gqa" not in parameters


@pytest.mark.parametrize("torch_version", sorted(VARLEN_FILES))
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 1), (2, 2)], ids=["gqa", "mqa", "mha"])
def test_the_varlen_branch_equals_per_sequence_attention(torch_version, heads, kv_heads, monkeypatch):
    varlen = load_varlen(VARLEN_FILES[torch_version])
    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", varlen.varlen_attn)
    lengths = [5, 1, 12, 7]
    tensors, cu_seqlens = _row(heads, kv_heads, lengths)
    calls = dict(varlen.kernel_calls)
    out, grads = _attend(packing._varlen_flash, tensors, cu_seqlens, max(lengths), 0.3)
    assert varlen.kernel_calls["forward"] == calls.get("forward", 0) + 1, "the substituted kernel ran"
    assert varlen.kernel_calls["backward"] == calls.get("backward", 0) + 1
    expected, expected_grads = _attend(packing._per_sequence_sdpa, tensors, cu_seqlens, 0.3)
    assert out.shape == (1, sum(lengths), heads, 8)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)
    for name, grad, expected_grad in zip("qkv", grads, expected_grads):
        assert expected_grad.abs().max() > 0, name
        # flash keeps the log-sum-exp for backward in float32, as the CPU kernel does
        torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=1e-5, msg=name)


def test_the_per_sequence_attention_attends_within_each_sequence_only():
    """The reference above is itself right: each sequence's output is its own causal SDPA."""
    lengths = [3, 9, 1, 4]
    (query, key, value), cu_seqlens = _row(4, 2, lengths)
    out = packing._per_sequence_sdpa(query, key, value, cu_seqlens, None)
    bounds = cu_seqlens.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        alone = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, a:b],
            key[:, :, a:b].repeat_interleave(2, 1),
            value[:, :, a:b].repeat_interleave(2, 1),
            is_causal=True,
        )
        torch.testing.assert_close(out[:, a:b], alone.transpose(1, 2), atol=1e-12, rtol=0)
