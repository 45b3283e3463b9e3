"""GRPO-TCR tensor functions against values computed by hand (docs/recipe.md section 5)."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.grpo.algorithm import (
    LOSS_AGGREGATIONS,
    aggregate_loss,
    broadcast_advantages,
    entropy_from_logits,
    group_advantages,
    importance_ratio,
    kl_penalty,
    masked_group_advantages,
    masked_mean,
    policy_loss,
    token_logprobs,
)


@pytest.fixture(autouse=True)
def _float64():
    """Hand values are compared to 1e-12, above float32 noise; restored for other test modules."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _leaf(values):
    return torch.tensor(values, requires_grad=True)


# --------------------------------------------------------------------------- advantages
def test_group_advantages_unbiased_std_by_hand():
    # group a = [1, 0, 0]: mean 1/3, unbiased var = ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3
    # group b = [2, -2, 0, 4]: mean 1, deviations [1, -3, -1, 3], var = 20 / 3
    rewards = torch.tensor([1.0, 2.0, 0.0, -2.0, 0.0, 0.0, 4.0])
    ids = ["a", "b", "a", "b", "a", "b", "b"]  # interleaved on purpose
    adv = group_advantages(rewards, ids, eps=0.0, norm_by_std=True)
    sa, sb = math.sqrt(1 / 3), math.sqrt(20 / 3)
    expected = [(2 / 3) / sa, 1 / sb, (-1 / 3) / sa, -3 / sb, (-1 / 3) / sa, -1 / sb, 3 / sb]
    assert adv.tolist() == pytest.approx(expected, abs=1e-12)


def test_group_advantages_contiguous_groups_eps_and_dr_grpo():
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 3.0, 1.0])
    adv = group_advantages(rewards, 2, eps=1e-6, norm_by_std=True)  # groups [1,-1], [-1,1], [3,1]: std sqrt(2) each
    s = math.sqrt(2) + 1e-6
    assert adv.tolist() == pytest.approx([1 / s, -1 / s, -1 / s, 1 / s, 1 / s, -1 / s], abs=1e-12)
    no_std = group_advantages(rewards, 2, norm_by_std=False)
    assert no_std.tolist() == pytest.approx([1, -1, -1, 1, 1, -1], abs=1e-12)


def test_group_advantages_equal_rewards_and_singletons_are_zero():
    rewards = torch.tensor([0.5, 0.5, 0.5, 7.0, -1.0, 1.0])
    adv = group_advantages(rewards, torch.tensor([0, 0, 0, 1, 2, 2]), norm_by_std=True)
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]  # all-equal group, and a group of one
    assert adv[4].item() == pytest.approx(-1 / (math.sqrt(2) + 1e-6))
    with pytest.raises(AssertionError, match="groups of 4"):
        group_advantages(rewards, 4, norm_by_std=True)


def test_masked_group_advantages_leave_the_masked_samples_out_of_their_group():
    # group 0 = [1, 0, 9 (left out), -1]: over [1, 0, -1], mean 0, unbiased std 1
    rewards = torch.tensor([1.0, 0.0, 9.0, -1.0, 3.0, 1.0, 5.0, 5.0])
    valid = torch.tensor([True, True, False, True, True, True, False, False])
    adv = masked_group_advantages(rewards, 4, valid, eps=0.0, norm_by_std=True)
    assert adv.tolist() == pytest.approx([1.0, 0.0, 0.0, -1.0, 1 / math.sqrt(2), -1 / math.sqrt(2), 0.0, 0.0])
    kept = group_advantages(rewards[valid], [0, 0, 0, 1, 1], eps=0.0, norm_by_std=True)
    assert adv[valid].tolist() == kept.tolist()
    everyone = torch.ones(8, dtype=torch.bool)
    for norm in (True, False):
        assert torch.equal(
            masked_group_advantages(rewards, 4, everyone, norm_by_std=norm),
            group_advantages(rewards, 4, norm_by_std=norm),
        ), "with nothing masked it is group_advantages exactly"
    one_left = masked_group_advantages(rewards, 4, torch.tensor([1, 0, 0, 0, 1, 1, 1, 1]), norm_by_std=True)
    assert one_left[:4].tolist() == [0.0] * 4, "a group with a single valid sample gets 0"
    assert masked_group_advantages(rewards, 4, torch.zeros(8), norm_by_std=True).tolist() == [0.0] * 8


def test_broadcast_advantages_zero_outside_mask():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    out = broadcast_advantages(torch.tensor([2.0, -1.0]), mask)
    assert out.tolist() == [[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]]


# --------------------------------------------------------------------------- clipped loss
# One row of six tokens, old_logp = 0 so ratio = exp(logp); clip [0.8, 1.28], dual clip 10.
# token  A    ratio  unclipped  clipped  max     dual      loss   d loss / d logp
#   0    +1   1.5    -1.5       -1.28    -1.28   -         -1.28  0      (high clip active)
#   1    +1   1.1    -1.1       -1.1     -1.1    -         -1.1   -1.1   (inside)
#   2    -2   0.5    1.0        1.6      1.6     min(.,20) 1.6    0      (low clip active)
#   3    -1   1.5    1.5        1.28     1.5     min(.,10) 1.5    1.5    (A<0 above 1+eps: no clip)
#   4    -1   20     20         1.28     20      min(.,10) 10     0      (dual clip)
#   5    +2   0.5    -1.0       -1.6     -1.0    -         -1.0   -1.0   (A>0 below 1-eps: no clip)
# token-mean: sum 9.72 / 6; gradient = column / 6.
RATIOS = [1.5, 1.1, 0.5, 1.5, 20.0, 0.5]
# The clip settings of the table (GRPO-TCR's: eps_low 0.2, eps_high 0.28, dual clip c = 10).
TCR_CLIP = {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 10.0}
# GRPO-TCR's whole loss: those clips, the token-level ratio, the token-mean aggregation.
TCR_LOSS = {**TCR_CLIP, "ratio_level": "token", "agg_mode": "token-mean"}
ADVANTAGES = [1.0, 1.0, -2.0, -1.0, -1.0, 2.0]


def test_policy_loss_asymmetric_and_dual_clip_by_hand():
    logp = _leaf([[math.log(r) for r in RATIOS]])
    loss, stats = policy_loss(logp, torch.zeros(1, 6), torch.tensor([ADVANTAGES]), torch.ones(1, 6), **TCR_LOSS)
    assert loss.item() == pytest.approx(9.72 / 6, abs=1e-12)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -1.1 / 6, 0.0, 1.5 / 6, 0.0, -1.0 / 6], abs=1e-12)
    assert stats["clip_frac_high"].item() == pytest.approx(1 / 6)
    assert stats["clip_frac_low"].item() == pytest.approx(1 / 6)
    assert stats["dual_clip_frac"].item() == pytest.approx(1 / 6)
    assert stats["ratio_mean"].item() == pytest.approx(sum(RATIOS) / 6)
    assert stats["ratio_max"].item() == pytest.approx(20.0)
    log_r = [math.log(r) for r in RATIOS]
    assert stats["approx_kl_k1"].item() == pytest.approx(-sum(log_r) / 6)
    assert stats["approx_kl_k3"].item() == pytest.approx(sum(r - 1 - lr for r, lr in zip(RATIOS, log_r)) / 6)


def test_policy_loss_without_dual_clip_keeps_large_negative_loss():
    logp = _leaf([[math.log(20.0)]])
    loss, stats = policy_loss(
        logp, torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1), **{**TCR_LOSS, "clip_c": None}
    )
    loss.backward()
    assert loss.item() == pytest.approx(20.0)
    assert logp.grad.item() == pytest.approx(20.0)  # d(-A e^logp)/dlogp = 20
    assert stats["dual_clip_frac"].item() == 0.0


def test_log_ratio_is_clamped_to_20():
    ratio = importance_ratio(torch.tensor([[50.0, -50.0]]), torch.zeros(1, 2), torch.ones(1, 2), level="token")
    assert ratio[0].tolist() == pytest.approx([math.exp(20.0), math.exp(-20.0)])


def test_masked_tokens_contribute_nothing_to_loss_or_gradient():
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]])
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.7, -1.2, -0.1, -2.2]])
    adv = broadcast_advantages(torch.tensor([1.0, -0.5]), mask)
    base = [[-0.8, -2.1, -0.4, -3.0], [-0.9, -1.0, -0.3, -2.0]]
    perturbed = [[-0.8, -2.1, 40.0, float("-inf")], [-0.9, float("nan"), -0.3, 25.0]]
    for mode in LOSS_AGGREGATIONS:
        for level in ("token", "sequence"):
            results = []
            for values in (base, perturbed):
                logp = _leaf(values)
                # advantages at masked positions are perturbed too: they must not matter either
                noisy_adv = torch.where(mask.bool(), adv, torch.full_like(adv, 123.0))
                loss, stats = policy_loss(logp, old, noisy_adv, mask, agg_mode=mode, ratio_level=level, **TCR_CLIP)
                loss.backward()
                results.append((loss.item(), logp.grad.clone(), {k: v.item() for k, v in stats.items()}))
            (loss_a, grad_a, stats_a), (loss_b, grad_b, stats_b) = results
            assert loss_a == loss_b, (mode, level)
            assert torch.equal(grad_a, grad_b), (mode, level)
            assert torch.all(grad_b[~mask.bool()] == 0), (mode, level)
            assert stats_a == stats_b, (mode, level)


# --------------------------------------------------------------------------- sequence ratio
def test_sequence_level_ratio_value_and_gradient_by_hand():
    # log-ratios: row 0 [0.2, 0.4, (masked 5.0)] -> s_0 = exp(0.3); row 1 [0.1, -0.1, 0.3] -> s_1 = exp(0.1)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    logp = _leaf([[0.2, 0.4, 5.0], [0.1, -0.1, 0.3]])
    adv = broadcast_advantages(torch.tensor([1.0, -1.0]), mask)
    loss, stats = policy_loss(
        logp,
        torch.zeros(2, 3),
        adv,
        mask,
        ratio_level="sequence",
        agg_mode="seq-mean-token-mean",
        clip_low=0.5,
        clip_high=0.5,
        clip_c=None,
    )
    s0, s1 = math.exp(0.3), math.exp(0.1)
    assert loss.item() == pytest.approx((-s0 + s1) / 2, abs=1e-12)
    loss.backward()
    # d/dlogp_{i,t} of (1/2) (1/|y_i|) sum_t -A_i s_i  =  -A_i s_i / (2 |y_i|)
    expected = [[-s0 / 4, -s0 / 4, 0.0], [s1 / 6, s1 / 6, s1 / 6]]
    assert torch.allclose(logp.grad, torch.tensor(expected), atol=1e-12)
    assert stats["ratio_mean"].item() == pytest.approx((2 * s0 + 3 * s1) / 5)

    # GSPO written directly at the sequence level gives the same gradient.
    direct = _leaf([[0.2, 0.4, 5.0], [0.1, -0.1, 0.3]])
    s = torch.exp(masked_mean(direct, mask, dim=-1))
    (-(torch.tensor([1.0, -1.0]) * s).mean()).backward()
    assert torch.allclose(direct.grad, torch.tensor(expected), atol=1e-12)


def test_sequence_level_clip_zeroes_the_whole_sequence():
    # s = exp(mean(0.5, 0.3)) = exp(0.4) = 1.49 > 1 + 0.28 with A > 0: clipped, zero gradient
    logp = _leaf([[0.5, 0.3], [0.01, -0.01]])
    adv = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    loss, stats = policy_loss(
        logp, torch.zeros(2, 2), adv, torch.ones(2, 2), ratio_level="sequence", agg_mode="token-mean", **TCR_CLIP
    )
    loss.backward()
    assert logp.grad[0].tolist() == [0.0, 0.0]
    assert logp.grad[1].tolist() == pytest.approx([-1.0 / 4, -1.0 / 4], abs=1e-12)  # s_1 = exp(0) = 1
    assert loss.item() == pytest.approx((-1.28 * 2 - 1.0 * 2) / 4)
    assert stats["clip_frac_high"].item() == pytest.approx(0.5)


# --------------------------------------------------------------------------- aggregation
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # third row empty: not a sequence


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("token-mean", 7 / 3), ("seq-mean-token-mean", (1.5 + 4.0) / 2), ("seq-mean-token-sum", (3.0 + 4.0) / 2)],
)
def test_aggregation_modes_by_hand(mode, expected):
    assert aggregate_loss(LOSS, MASK, mode=mode).item() == pytest.approx(expected, abs=1e-12)


def test_aggregation_unknown_mode_names_the_choices():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_loss(LOSS, MASK, mode="token-sum")


def test_micro_batches_with_global_token_count_sum_to_the_mini_batch_token_mean():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    old = -torch.rand(4, 5)
    logp_values = (old + 0.3 * torch.randn(4, 5)).tolist()
    adv = broadcast_advantages(torch.tensor([1.0, -1.0, 0.5, -0.5]), mask)

    full = _leaf(logp_values)
    full_loss, _ = policy_loss(full, old, adv, mask, **TCR_LOSS)
    full_loss.backward()

    micro = _leaf(logp_values)
    total_tokens = int(mask.sum())  # 12 tokens; micro-batches hold 5 and 7
    accumulated = 0.0
    for rows in (slice(0, 2), slice(2, 4)):
        part, _ = policy_loss(
            micro[rows], old[rows], adv[rows], mask[rows], global_token_count=total_tokens, **TCR_LOSS
        )
        part.backward()
        accumulated += part.item()
    assert accumulated == pytest.approx(full_loss.item(), abs=1e-12)
    assert torch.allclose(micro.grad, full.grad, atol=1e-12)

    # Averaging the micro-batch token means is a different quantity here (5 vs 7 tokens).
    means = [
        policy_loss(micro[r].detach(), old[r], adv[r], mask[r], **TCR_LOSS)[0].item()
        for r in (slice(0, 2), slice(2, 4))
    ]
    assert sum(means) / 2 != pytest.approx(full_loss.item(), abs=1e-6)


def test_global_seq_count_for_sequence_modes():
    halves = [
        aggregate_loss(LOSS[rows], MASK[rows], mode="seq-mean-token-mean", global_seq_count=2)
        for rows in (slice(0, 1), slice(1, 3))
    ]
    assert sum(h.item() for h in halves) == pytest.approx(aggregate_loss(LOSS, MASK, mode="seq-mean-token-mean").item())


# --------------------------------------------------------------------------- KL, entropy, log-probs
def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([[0.0]]), torch.tensor([[math.log(2.0)]])
    assert kl_penalty(logp, ref, kind="k1").item() == pytest.approx(-math.log(2))
    assert kl_penalty(logp, ref, kind="k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_penalty(logp, ref, kind="k3").item() == pytest.approx(2 - math.log(2) - 1)
    assert kl_penalty(torch.tensor([[0.0]]), torch.tensor([[30.0]]), kind="k3").item() == 10.0  # clamped
    assert kl_penalty(torch.tensor([[-1.3]]), torch.tensor([[-1.3]]), kind="k3").item() == 0.0
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(logp, ref, kind="k4")


def test_entropy_from_logits_by_hand_and_stable():
    # p = [1/2, 1/4, 1/4]: H = 1.5 ln 2; uniform over 4: ln 4; logits shifted by 1000 change nothing
    logits = torch.tensor([[[math.log(0.5), math.log(0.25), math.log(0.25), -1e4], [0.0, 0.0, 0.0, 0.0]]])
    expected = [1.5 * math.log(2), math.log(4)]
    assert entropy_from_logits(logits)[0].tolist() == pytest.approx(expected, abs=1e-9)
    assert entropy_from_logits(logits + 1000.0)[0].tolist() == pytest.approx(expected, abs=1e-9)
    peaked = entropy_from_logits(torch.tensor([[[1e4, 0.0, 0.0]]], dtype=torch.float32))
    assert torch.isfinite(peaked).all() and peaked.item() == pytest.approx(0.0, abs=1e-6)

    random_logits = torch.randn(2, 3, 7) * 4
    direct = torch.distributions.Categorical(logits=random_logits).entropy()
    assert torch.allclose(entropy_from_logits(random_logits), direct, atol=1e-10)


def test_token_logprobs_match_log_softmax_with_temperature_and_gradient():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 6, requires_grad=True)
    labels = torch.tensor([[0, 5, 2, 2], [1, 1, 3, 4]])
    for temperature in (1.0, 0.7):
        ours = token_logprobs(logits, labels, temperature)
        reference = torch.log_softmax(logits / temperature, dim=-1).gather(-1, labels[..., None]).squeeze(-1)
        assert torch.allclose(ours, reference, atol=1e-12)
        (grad_ours,) = torch.autograd.grad(ours.sum(), logits)
        (grad_ref,) = torch.autograd.grad(reference.sum(), logits)
        assert torch.allclose(grad_ours, grad_ref, atol=1e-12)
    # Hand value: logits [0, ln 3] -> p = [1/4, 3/4]
    two = torch.tensor([[[0.0, math.log(3.0)]]])
    assert token_logprobs(two, torch.tensor([[1]])).item() == pytest.approx(math.log(0.75))
    half = token_logprobs(two.to(torch.bfloat16), torch.tensor([[1]]))
    assert half.dtype == torch.float32 and half.item() == pytest.approx(math.log(0.75), abs=1e-2)
