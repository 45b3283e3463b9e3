"""Off-policy correction of asynchronous GRPO: decoupled PPO with a truncated importance weight
(``behaviour_importance_weight`` and ``policy_loss(behaviour_weight=...)``) against hand values."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.grpo.algorithm import (
    LOSS_AGGREGATIONS,
    behaviour_importance_weight,
    per_token_policy_loss,
    policy_loss,
)

CLIPS = {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 10.0}


@pytest.fixture(autouse=True)
def _float64():
    """Hand values are compared to 1e-12, above float32 noise; restored for other test modules."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _hand_case():
    """Two sequences of three tokens; the last token of the second is masked (garbage log-probs)."""
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    proximal = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -1.0, -3.0]])
    ratio = torch.tensor([[1.1, 1.5, 0.9], [0.7, 1.2, 1.0]])  # pi_theta / pi_prox
    weight = torch.tensor([[1.0, 0.5, 3.0], [1.25, 0.8, 1.0]])  # pi_prox / pi_behav before the cap
    logp = (proximal + ratio.log()).requires_grad_()
    behaviour = proximal - weight.log()
    behaviour[1, 2] = -math.inf  # padding: must reach neither the weight nor the loss
    return logp, proximal, behaviour, advantages, mask


def test_hand_worked_token_level_weight_loss_and_gradient():
    logp, proximal, behaviour, advantages, mask = _hand_case()
    w = behaviour_importance_weight(proximal, behaviour, mask, cap=2.0, level="token")
    # min(pi_prox / pi_behav, 2): 3.0 is truncated to the cap; the masked token gets 0
    assert w.flatten().tolist() == pytest.approx([1.0, 0.5, 2.0, 1.25, 0.8, 0.0], abs=1e-12)

    loss, stats = policy_loss(
        logp,
        proximal,
        advantages,
        mask,
        **CLIPS,
        ratio_level="token",
        agg_mode="token-mean",
        behaviour_weight=w,
        behaviour_weight_cap=2.0,
    )
    # A = +1: l = max(-rho, -clip(rho, 0.8, 1.28))
    #   rho 1.1 -> -1.1 (d/dlogp = -rho = -1.1); rho 1.5 -> -1.28 (clipped, grad 0); rho 0.9 -> -0.9 (grad -0.9)
    # A = -1: l = min(max(rho, clip(rho)), 10)
    #   rho 0.7 -> 0.8 (clipped, grad 0); rho 1.2 -> 1.2 (grad +1.2)
    # weighted: [-1.1 * 1, -1.28 * 0.5, -0.9 * 2] + [0.8 * 1.25, 1.2 * 0.8] = [-1.1, -0.64, -1.8] + [1.0, 0.96]
    # token mean over the 5 loss tokens: (-1.1 - 0.64 - 1.8 + 1.0 + 0.96) / 5 = -1.58 / 5 = -0.316
    assert loss.item() == pytest.approx(-0.316, abs=1e-12)
    loss.backward()
    # d loss / d logp = w * dl/dlogp / 5: [-1.1 / 5, 0, -0.9 * 2 / 5], [0, 1.2 * 0.8 / 5, 0]
    assert logp.grad.flatten().tolist() == pytest.approx([-0.22, 0.0, -0.36, 0.0, 0.192, 0.0], abs=1e-12)
    # weights over the loss tokens: mean (1 + 0.5 + 2 + 1.25 + 0.8) / 5 = 1.11, max 2, truncated 1 of 5
    assert stats["is_weight_mean"].item() == pytest.approx(1.11, abs=1e-12)
    assert stats["is_weight_max"].item() == 2.0
    assert stats["is_truncated_frac"].item() == pytest.approx(0.2, abs=1e-7)  # a float32 share, as the clip fractions
    assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())


def test_sequence_level_is_the_capped_geometric_mean_over_loss_tokens():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    behaviour = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -math.inf], [0.0, 0.0, 0.0]])
    proximal = behaviour + torch.tensor([[0.2, -0.4, 0.5], [1.0, 0.6, 0.0], [5.0, 5.0, 5.0]])
    proximal[1, 2] = math.nan  # masked
    w = behaviour_importance_weight(proximal, behaviour, mask, cap=2.0, level="sequence")
    # sequence 0: exp((0.2 - 0.4 + 0.5) / 3) = exp(0.1) = (e^0.2 e^-0.4 e^0.5)^(1/3) ~ 1.105 < 2
    # sequence 1: exp((1.0 + 0.6) / 2) = exp(0.8) ~ 2.226 > 2 -> 2; sequence 2 has no loss token
    geometric = (math.exp(0.2) * math.exp(-0.4) * math.exp(0.5)) ** (1 / 3)
    assert w.flatten().tolist() == pytest.approx([geometric] * 3 + [2.0, 2.0, 0.0] + [0.0] * 3, abs=1e-12)
    assert geometric == pytest.approx(math.exp(0.1), abs=1e-12)


def test_log_weight_is_clamped_before_exp():
    mask = torch.ones(1, 2)
    w = behaviour_importance_weight(
        torch.tensor([[-50.0, 0.0]]), torch.tensor([[0.0, -math.inf]]), mask, cap=2.0, level="token"
    )
    assert w.flatten().tolist() == pytest.approx([math.exp(-20.0), 2.0], rel=1e-12)


def _random_batch(seed: int):
    generator = torch.Generator().manual_seed(seed)
    shape = (4, 7)
    old_logp = -torch.rand(shape, generator=generator) * 3
    logp = (old_logp + 0.4 * torch.randn(shape, generator=generator)).requires_grad_()
    advantages = torch.randn(shape[0], generator=generator)[:, None].expand(shape).clone()
    mask = (torch.rand(shape, generator=generator) > 0.3).long()
    mask[0] = 0  # a sequence without loss tokens
    return logp, old_logp, advantages, mask


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize("agg_mode", sorted(LOSS_AGGREGATIONS))
@pytest.mark.parametrize("clip_c", [10.0, None])
def test_behaviour_equal_to_proximal_changes_nothing(ratio_level, agg_mode, clip_c):
    logp, old_logp, advantages, mask = _random_batch(seed=3)
    w = behaviour_importance_weight(old_logp, old_logp, mask, cap=2.0, level=ratio_level)
    assert torch.equal(w, mask.to(w.dtype))  # 1 on loss tokens, 0 elsewhere
    settings = {"clip_low": 0.2, "clip_high": 0.28, "clip_c": clip_c, "ratio_level": ratio_level, "agg_mode": agg_mode}

    plain, plain_stats = policy_loss(logp, old_logp, advantages, mask, **settings)
    (plain_grad,) = torch.autograd.grad(plain, logp)
    weighted, weighted_stats = policy_loss(
        logp, old_logp, advantages, mask, **settings, behaviour_weight=w, behaviour_weight_cap=2.0
    )
    (weighted_grad,) = torch.autograd.grad(weighted, logp)
    assert torch.equal(plain, weighted)
    assert torch.equal(plain_grad, weighted_grad)
    assert all(torch.equal(plain_stats[k], weighted_stats[k]) for k in plain_stats)
    assert weighted_stats["is_weight_mean"].item() == 1.0 and weighted_stats["is_truncated_frac"].item() == 0.0


def test_weight_carries_no_gradient():
    logp, old_logp, advantages, mask = _random_batch(seed=5)
    proximal = old_logp.clone().requires_grad_()
    behaviour = (old_logp - 0.3 * torch.rand(old_logp.shape)).requires_grad_()
    for level in ("token", "sequence"):
        w = behaviour_importance_weight(proximal, behaviour, mask, cap=2.0, level=level)
        assert not w.requires_grad
    # A weight built with grad by hand is detached by the loss too.
    by_hand = torch.exp(proximal - behaviour).clamp(max=2.0)
    loss, _ = policy_loss(
        logp,
        proximal,
        advantages,
        mask,
        **CLIPS,
        ratio_level="token",
        agg_mode="token-mean",
        behaviour_weight=by_hand,
        behaviour_weight_cap=2.0,
    )
    loss.backward()
    assert proximal.grad is None and behaviour.grad is None
    assert logp.grad is not None and logp.grad.abs().sum() > 0


def test_per_token_loss_is_the_clipped_loss_times_the_weight():
    logp, old_logp, advantages, mask = _random_batch(seed=7)
    behaviour = old_logp - 0.5 * torch.randn(old_logp.shape, generator=torch.Generator().manual_seed(8))
    w = behaviour_importance_weight(old_logp, behaviour, mask, cap=1.5, level="token")
    plain, _ = per_token_policy_loss(logp, old_logp, advantages, mask, **CLIPS, ratio_level="token")
    weighted, stats = per_token_policy_loss(
        logp, old_logp, advantages, mask, **CLIPS, ratio_level="token", behaviour_weight=w, behaviour_weight_cap=1.5
    )
    keep = mask.bool()
    assert torch.equal(weighted[keep], plain[keep] * w[keep])
    assert stats["is_truncated_frac"].item() == pytest.approx(((w == 1.5) & keep).sum().item() / keep.sum().item())


def test_arguments_are_checked():
    logp, old_logp, advantages, mask = _random_batch(seed=9)
    with pytest.raises(ValueError, match="importance weight level"):
        behaviour_importance_weight(old_logp, old_logp, mask, cap=2.0, level="sentence")
    with pytest.raises(AssertionError, match="cap must be at least 1"):
        behaviour_importance_weight(old_logp, old_logp, mask, cap=0.5, level="token")
    with pytest.raises(AssertionError, match="behaviour_weight_cap"):
        per_token_policy_loss(
            logp, old_logp, advantages, mask, **CLIPS, ratio_level="token", behaviour_weight=torch.ones_like(old_logp)
        )
