"""torch's varlen attention module (``torch/nn/attention/varlen.py``) of another torch version,
runnable on CPU.

The module's public ``varlen_attn`` differs between versions (torch 2.11.0's has no
``enable_gqa``, 2.13's has), and its custom op runs torch's flash kernel
(``aten._flash_attention_forward``), CUDA only. :func:`load_varlen` runs a version's file as it
is (``tests/fixtures/torch-2.11.0-varlen.py.txt`` is ``torch/nn/attention/varlen.py`` of
``torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl``, sha256 9efc95d2...cca00, PyTorch's
BSD-3-Clause licence), with two changes: its custom ops are registered under a namespace of their
own (the installed torch has registered ``torch_attn::*`` already), and the two that call the
flash kernel, the forward and its backward, get a CPU kernel: causal attention of each sequence
apart, in plain tensor math. Everything above those two calls, the public function's signature
and checks, the ops' schemas and the autograd wiring (what is saved for backward), is that
version's own code.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import types
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TORCH_2_11_VARLEN = FIXTURES / "torch-2.11.0-varlen.py.txt"


def installed_varlen_file() -> Path:
    import torch.nn.attention

    return Path(torch.nn.attention.__file__).parent / "varlen.py"


def _bounds(cu_seqlens, total: int, longest_allowed: int, name: str) -> list[tuple[int, int]]:
    bounds = cu_seqlens.tolist()
    assert bounds[0] == 0 and bounds[-1] == total, f"cu_seq_{name} {bounds} for {total} tokens"
    pairs = list(zip(bounds[:-1], bounds[1:]))
    longest = max(b - a for a, b in pairs)
    assert longest_allowed >= longest, f"max_{name} {longest_allowed} under the longest sequence, {longest}"
    return pairs


def _sequences(query, key, value, cu_seq, maxima, is_causal, window_size, enable_gqa):
    """Each sequence's query rows, ``(H, L_q, D)`` query and ``(H, L_k, D)`` key and value (heads
    repeated for GQA) and its causal mask, aligned at the bottom right as flash's is, after the
    checks the flash kernel's arguments must pass (flash sizes its grid by ``max_q``, ``max_k``)."""
    assert is_causal and list(window_size) == [-1, 0], f"causal attention expected, got {is_causal} {window_size}"
    groups = query.shape[1] // key.shape[1]
    # torch 2.11's varlen_attn documents one head count (T, H, D) for query, key and value
    assert groups == 1 or enable_gqa, f"{query.shape[1]} query heads, {key.shape[1]} key/value heads, no enable_gqa"
    (cu_seq_q, cu_seq_k), (max_q, max_k) = cu_seq, maxima
    rows = _bounds(cu_seq_q, query.shape[0], max_q, "q")
    columns = _bounds(cu_seq_k, key.shape[0], max_k, "k")
    assert len(rows) == len(columns), f"{len(rows)} query sequences, {len(columns)} key sequences"
    for (a, b), (c, d) in zip(rows, columns):
        q, k, v = query[a:b].transpose(0, 1), key[c:d].transpose(0, 1), value[c:d].transpose(0, 1)
        causal = torch.ones(b - a, d - c, dtype=torch.bool, device=q.device).tril((d - c) - (b - a))
        yield (a, b, c, d), q, k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0), causal


def _scale(query, scale) -> float:
    return query.shape[-1] ** -0.5 if scale is None else scale


def _attention_forward(query, key, value, cu_seq, maxima, is_causal, scale, window_size, enable_gqa):
    """``(T, H, D)`` -> ``(T, H, D)`` output and ``(H, T)`` log-sum-exp, each sequence apart."""
    outputs, lses = [], []
    for _, q, k, v, causal in _sequences(query, key, value, cu_seq, maxima, is_causal, window_size, enable_gqa):
        scores = ((q @ k.transpose(1, 2)) * _scale(query, scale)).masked_fill(~causal, float("-inf"))
        lse = scores.logsumexp(-1)
        outputs.append((scores - lse[..., None]).exp() @ v)
        lses.append(lse)
    return torch.cat(outputs, 1).transpose(0, 1).contiguous(), torch.cat(lses, 1).float()


def _attention_backward(grad_out, query, key, value, out, lse, cu_seq, maxima, is_causal, scale, window_size):
    """Flash's backward: the probabilities again from the saved log-sum-exp, then
    dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = dS K s, dK = dS^T Q s (summed per KV head)."""
    grads = [torch.zeros_like(x) for x in (query, key, value)]
    groups = query.shape[1] // key.shape[1]
    s = _scale(query, scale)
    for (a, b, c, d), q, k, v, causal in _sequences(query, key, value, cu_seq, maxima, is_causal, window_size, True):
        scores = ((q @ k.transpose(1, 2)) * s).masked_fill(~causal, float("-inf"))
        probs = (scores - lse[:, a:b, None].to(scores.dtype)).exp()
        d_out, o = grad_out[a:b].transpose(0, 1), out[a:b].transpose(0, 1)
        d_scores = probs * (d_out @ v.transpose(1, 2) - (d_out * o).sum(-1, keepdim=True))
        per_head = (d_scores @ k * s, d_scores.transpose(1, 2) @ q * s, probs.transpose(1, 2) @ d_out)
        for grad, (start, end), g, heads in zip(grads, ((a, b), (c, d), (c, d)), per_head, (1, groups, groups)):
            grad[start:end] += g.unflatten(0, (-1, heads)).sum(1).transpose(0, 1)
    return tuple(grads)


def _kernels(calls: collections.Counter):
    def forward(
        query,
        key,
        value,
        cu_seq_q,
        cu_seq_k,
        max_q,
        max_k,
        is_causal=False,
        scale=None,
        window_size=None,
        enable_gqa=False,
        seqused_k=None,
        block_table=None,
        num_splits=None,
    ):
        calls["forward"] += 1
        assert seqused_k is None and block_table is None and num_splits is None
        cu_seq, maxima = (cu_seq_q, cu_seq_k), (max_q, max_k)
        out, lse = _attention_forward(query, key, value, cu_seq, maxima, is_causal, scale, window_size, enable_gqa)
        return out, lse, torch.zeros(2, dtype=torch.uint64)

    def backward(
        grad_out,
        query,
        key,
        value,
        out,
        lse,
        cu_seq_q,
        cu_seq_k,
        max_q,
        max_k,
        is_causal,
        rng_state,
        scale=None,
        window_size=None,
    ):
        calls["backward"] += 1
        cu_seq, maxima = (cu_seq_q, cu_seq_k), (max_q, max_k)
        return _attention_backward(grad_out, query, key, value, out, lse, cu_seq, maxima, is_causal, scale, window_size)

    return forward, backward


@functools.cache
def load_varlen(source: Path) -> types.ModuleType:
    """``source`` (a torch version's ``varlen.py``) as a module whose flash calls run on CPU;
    ``module.kernel_calls`` counts the forward and backward kernel calls. Loaded once per process
    (custom ops register once)."""
    namespace = "agentrl_test_varlen_" + hashlib.sha256(str(source).encode()).hexdigest()[:12]
    text = source.read_text(encoding="utf-8")
    renamed = text.replace('"torch_attn::', f'"{namespace}::').replace(
        "torch.ops.torch_attn.", f"torch.ops.{namespace}."
    )
    assert text.count("torch_attn") == renamed.count(namespace) > 0, f"{source}: every torch_attn op renamed"
    module = types.ModuleType(namespace)
    module.__file__ = str(source)
    exec(compile(renamed, str(source), "exec"), module.__dict__)
    module.kernel_calls = collections.Counter()
    forward, backward = _kernels(module.kernel_calls)
    module._varlen_attn.register_kernel("cpu")(forward)
    module._varlen_attn_backward.register_kernel("cpu")(backward)
    return module
