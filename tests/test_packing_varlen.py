"""The packed attention (training.packing) at the attention call, on rows of separate
sequences and of sequences sharing a prompt (each other one holding only the prompt's last token).

Its CUDA branch, torch's varlen flash kernel, is run against the varlen_attn of each torch version
it meets: 2.11.0 (gpu_check.sh's target GPU node; no ``enable_gqa``) and the installed one. torch's own
``varlen.py`` of that version runs, its flash calls replaced by a CPU kernel of flash's semantics
(helpers.torch_varlen), so the arguments the CUDA branch builds are checked by that version's
signature, checks and autograd; its output and gradients must equal the CPU branch's (SDPA per
segment), and that one's output each sequence's own causal attention computed alone.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.attention.varlen
from helpers.torch_varlen import TORCH_2_11_VARLEN, installed_varlen_file, load_varlen

from agentrl.training import packing
from agentrl.training.packing import pack_sequences

VARLEN_FILES = {"torch-2.11.0": TORCH_2_11_VARLEN, "installed": installed_varlen_file()}
# two prompts of 5 and 4 tokens with 3 and 2 responses, a sequence alone, lengths 1 to 12
PROMPT_A, PROMPT_B = [11, 12, 13, 14, 15], [21, 22, 23, 24]
SEQUENCES = [
    PROMPT_A + [31, 32, 33],
    PROMPT_B + [41],
    [7],
    PROMPT_A + [34, 35, 36, 37, 38, 39, 30],
    PROMPT_B + [42, 43, 44, 45, 46, 47],
    PROMPT_A + [33],
]
PREFIXES = [5, 4, 1, 5, 4, 5]
HEAD_DIM = 8


def _row(shared: bool):
    return pack_sequences(SEQUENCES, PREFIXES if shared else None)


def _states(tokens: torch.Tensor, positions: torch.Tensor, heads: int, kv_heads: int):
    """Query ``(1, H, T, D)`` and key, value ``(1, H_kv, T, D)`` as a function of each token and its
    position only, as a layer's projections are (so a shared prompt's are its sequences' own),
    laid out as transformers hands them to an attention function: transposed ``(1, T, H, D)``."""
    generator = torch.Generator().manual_seed(heads * 10 + kv_heads)
    out = []
    for n in (heads, kv_heads, kv_heads):
        by_token = torch.randn(64, n, HEAD_DIM, generator=generator, dtype=torch.float64)
        by_position = torch.randn(16, n, HEAD_DIM, generator=generator, dtype=torch.float64)
        states = by_token[tokens] + by_position[positions]  # (T, n, D)
        out.append(states[None].transpose(1, 2).detach().requires_grad_())
    return out


def _attend(tensors, row, flash: bool):
    out = packing._packed_attention(*tensors, 0.3, row.model_inputs(), flash)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    grads = torch.autograd.grad((out * weights).sum(), tensors)
    return out.detach(), grads


def test_a_shared_prompt_is_held_once_and_each_other_sequence_keeps_its_last_token():
    row = pack_sequences([[1, 2, 3, 4, 5], [1, 2, 3, 9], [7, 8], [1, 2, 3, 6, 6]], [3, 3, 1, 3])
    assert row.input_ids.tolist() == [[1, 2, 3, 4, 5, 3, 9, 7, 8, 3, 6, 6]]
    assert row.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 0, 1, 2, 3, 4]]
    assert row.cu_seqlens.tolist() == [0, 5, 7, 9, 12] and row.max_length == 5
    assert row.starts.tolist() == [0, 3, 7, 7], "token t of sequence i at starts[i] + t"
    assert row.keys.index.tolist() == [0, 1, 2, 3, 4, 0, 1, 5, 6, 7, 8, 0, 1, 9, 10, 11]
    assert row.keys.cu_seqlens.tolist() == [0, 5, 9, 11, 16] and row.keys.max_length == 5
    separate = pack_sequences([[1, 2, 3], [1, 2, 4]])
    assert separate.keys is None and separate.starts.tolist() == [0, 3]
    other_prompts = pack_sequences([[1, 2, 3, 4], [1, 2, 5, 4], [1, 2, 3, 4]], [3, 3, 2])
    assert other_prompts.keys is None and other_prompts.input_ids.shape == (1, 12), "prompts differ: nothing shared"


@pytest.mark.parametrize("shared", [False, True], ids=["separate", "shared_prompts"])
def test_each_segment_attends_as_its_whole_sequence_alone(shared):
    row = _row(shared)
    query, key, value = _states(row.input_ids[0], row.position_ids[0], 4, 2)
    out = packing._packed_attention(query, key, value, 0.3, row.model_inputs(), flash=False)[0]
    assert out.shape == (row.input_ids.shape[1], 4, HEAD_DIM)
    for i, (sequence, start) in enumerate(zip(SEQUENCES, row.starts.tolist())):
        tokens = torch.tensor(sequence)
        q, k, v = _states(tokens, torch.arange(len(sequence)), 4, 2)
        alone = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
        held = range(int(row.cu_seqlens[i]) - start, len(sequence))  # the tokens its segment holds
        assert len(held) == int(row.lengths[i])
        torch.testing.assert_close(out[start + held.start :][: len(held)], alone[0].transpose(0, 1)[held.start :])


def test_the_fixture_is_torch_2_11s_varlen_attn_without_enable_gqa():
    parameters = inspect.signature(load_varlen(TORCH_2_11_VARLEN).varlen_attn).parameters
    assert "window_size" in parameters and "enable_gqa" not in parameters


@pytest.mark.parametrize("shared", [False, True], ids=["separate", "shared_prompts"])
@pytest.mark.parametrize("torch_version", sorted(VARLEN_FILES))
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 1), (2, 2)], ids=["gqa", "mqa", "mha"])
def test_the_varlen_branch_equals_the_sdpa_branch(torch_version, heads, kv_heads, shared, monkeypatch):
    varlen = load_varlen(VARLEN_FILES[torch_version])
    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", varlen.varlen_attn)
    row = _row(shared)
    tensors = _states(row.input_ids[0], row.position_ids[0], heads, kv_heads)
    calls = dict(varlen.kernel_calls)
    out, grads = _attend(tensors, row, flash=True)
    assert varlen.kernel_calls["forward"] == calls.get("forward", 0) + 1, "the substituted kernel ran"
    assert varlen.kernel_calls["backward"] == calls.get("backward", 0) + 1
    expected, expected_grads = _attend(tensors, row, flash=False)
    assert out.shape == (1, row.input_ids.shape[1], heads, HEAD_DIM)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)
    for name, grad, expected_grad in zip("qkv", grads, expected_grads):
        assert expected_grad.abs().max() > 0, name
        # flash keeps the log-sum-exp for backward in float32, as the CPU kernel does
        torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=1e-5, msg=name)
