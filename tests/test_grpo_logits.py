"""Only what the loss needs from the vocabulary projection.

The sampled token's log-prob in float32 blocks of rows with its own backward equals the plain
log-softmax (forward and gradient, any temperature, 16-bit logits included); the blockwise
entropy equals the plain one; and the update computes no vocabulary-wide entropy when no loss
term uses it: the statistic then comes from the no-grad recomputation pass, or from the first
mini-batch when there is none.
"""

from __future__ import annotations

import pytest
import torch
from helpers.grpo_updates import deepspeed_update

from agentrl.grpo import algorithm as alg
from agentrl.grpo import policy


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(alg, "LOGIT_BLOCK_ELEMENTS", 3 * 50)  # 3 rows of a 50-token vocabulary per block


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_blockwise_sampled_token_logprobs_equal_log_softmax_and_its_gradient(temperature, small_blocks):
    generator = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(11, 50, generator=generator, dtype=torch.float64)).requires_grad_()
    labels = torch.randint(0, 50, (11,), generator=generator)
    weights = torch.randn(11, generator=generator, dtype=torch.float64)
    reference = torch.log_softmax(logits / temperature, dim=-1).gather(-1, labels[:, None])[:, 0]
    (expected,) = torch.autograd.grad((reference * weights).sum(), logits)

    fp32 = logits.detach().float().requires_grad_()
    logp = alg.sampled_token_logprobs(fp32, labels, temperature)
    (grad,) = torch.autograd.grad((logp * weights.float()).sum(), fp32)
    assert logp.dtype == torch.float32 and grad.dtype == torch.float32
    torch.testing.assert_close(logp.double(), reference.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad.double(), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(logp, alg.token_logprobs(fp32[None], labels[None], temperature)[0], atol=1e-6, rtol=0)


def test_bf16_logits_give_float32_logprobs_of_those_logits_and_a_bf16_gradient(small_blocks):
    generator = torch.Generator().manual_seed(1)
    logits = (3 * torch.randn(7, 50, generator=generator)).bfloat16().requires_grad_()
    labels = torch.randint(0, 50, (7,), generator=generator)
    logp = alg.sampled_token_logprobs(logits, labels, 0.7)
    (grad,) = torch.autograd.grad(logp.sum(), logits)
    exact = logits.detach().double()
    reference = torch.log_softmax(exact / 0.7, dim=-1).gather(-1, labels[:, None])[:, 0]
    assert logp.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(logp.double(), reference, atol=1e-5, rtol=1e-5)  # no bf16 rounding of the result
    expected = (torch.nn.functional.one_hot(labels, 50) - torch.softmax(exact / 0.7, -1)) / 0.7
    torch.testing.assert_close(grad.double(), expected, atol=1e-2, rtol=1e-2)


def test_blockwise_entropy_equals_the_entropy_of_the_tempered_softmax(small_blocks):
    logits = 3 * torch.randn(10, 50, generator=torch.Generator().manual_seed(2))
    expected = alg.entropy_from_logits((logits / 0.7)[None])[0]
    torch.testing.assert_close(alg.blockwise_entropy(logits, 0.7), expected, atol=1e-6, rtol=1e-6)


def _entropy_calls(monkeypatch) -> list[bool]:
    """Whether gradients were on at each call of the statistic's entropy (on: inside the update)."""
    calls: list[bool] = []
    real = policy.blockwise_entropy

    def recording(logits, temperature):
        calls.append(torch.is_grad_enabled())
        return real(logits, temperature)

    monkeypatch.setattr(policy, "blockwise_entropy", recording)
    monkeypatch.setattr(policy, "entropy_from_logits", lambda *a: pytest.fail("a differentiable entropy at coef 0"))
    return calls


def test_the_update_computes_no_entropy_when_the_recomputation_pass_logs_it(monkeypatch):
    from helpers.grpo_updates import uneven_samples
    from helpers.rollout import random_policy

    samples = uneven_samples(300, ((6, (9, 3)), (4, (14, 1))))
    calls = _entropy_calls(monkeypatch)
    # two mini-batches: the old log-probs are recomputed before the update
    _, stats, norms, *_ = deepspeed_update(random_policy(), samples, 10_000, {"mini_batch_prompts": 1})
    assert len(norms) == 2 and calls and not any(calls), calls
    assert stats["actor/entropy"] > 0


def test_without_a_recomputation_pass_the_first_mini_batch_logs_the_entropy_without_gradient(monkeypatch):
    from helpers.grpo_updates import uneven_samples
    from helpers.rollout import random_policy

    samples = uneven_samples(300, ((6, (9, 3)), (4, (14, 1))))
    calls = _entropy_calls(monkeypatch)
    _, stats, norms, *_ = deepspeed_update(random_policy(), samples, 10_000, {"mini_batch_prompts": 2})
    assert len(norms) == 1 and calls, "one mini-batch: no recomputation pass, the update logs it"
    assert stats["actor/entropy"] > 0
