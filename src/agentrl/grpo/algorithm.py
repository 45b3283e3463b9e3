"""GRPO-TCR as pure tensor functions (docs/recipe.md section 5).

The recipe (upstream ``recipe/demystify`` on the authors' verl fork):

- advantage per prompt group of n samples: ``A_i = (r_i - mean(r)) / (std(r) + 1e-6)`` with the
  unbiased std, broadcast over the response tokens whose loss mask is 1;
- token-level PPO ratio ``rho = exp(clamp(logp - old_logp, -20, 20))``, asymmetric clip
  ("C", clip-higher) ``[1 - 0.2, 1 + 0.28]`` and dual clip ``c = 10`` for negative advantages;
- token-mean aggregation over every loss-mask token of the mini-batch ("T");
- no KL term, no reference model, entropy coefficient 0 (the KL estimators below serve the
  GRPO-T baseline and the logged distance to the old policy).
  Overlong shaping ("R") lives in the reward, not here.

The paper's GRPO-SCR variant uses a sequence-level ratio (GSPO); ``policy_loss`` offers it as
``ratio_level="sequence"``. Asynchronous rollouts (one step off policy) come from a behaviour
policy behind the proximal one (whose log-probs the trainer recomputes): ``policy_loss`` then takes
a truncated importance weight (:func:`behaviour_importance_weight`), as decoupled PPO does.
Shapes: ``B`` sequences, ``T`` response positions, ``V`` vocabulary.
The loss mask is 1 on tokens the model sampled and 0 on tool output, template and padding.
The settings a variant chooses (``norm_by_std``, the ratio level, the aggregation mode, the KL
estimator) are required keyword arguments, without defaults: their values live in one place,
the variants of :mod:`agentrl.grpo.variants`.

Deliberate departures from verl (the upstream code), each with its reason:

1. A prompt group holding a single sample gets advantage 0. verl uses mean 0 and std 1 there,
   so the raw reward becomes the advantage - a policy gradient without a baseline that the
   other groups do not get. With the recipe's 16 samples per prompt this never happens.
2. ``token-mean`` under gradient accumulation: pass ``global_token_count`` (the mini-batch's
   loss-token count) and the micro-batch losses *sum* to the exact mini-batch token mean. verl
   rescales each micro-batch's own token mean by the micro/mini batch-size ratio, which weighs
   a token in a short micro-batch more than one in a long micro-batch.
3. Masking uses ``torch.where``, not multiplication by the mask, and the policy loss zeroes
   its inputs at masked positions first, so a non-finite value there (a -inf or NaN log-prob
   of padding) cannot leak a NaN into the loss or the gradient (0 * NaN is NaN).
4. The ``seq-mean-*`` modes count only sequences with at least one loss token (verl divides
   an empty row's sum by zero).
5. The sequence-level ratio clamps the *sequence* log-ratio to +-``log_ratio_clamp`` (verl's GSPO
   clamps the combined log-ratio at +10 only), and it combines with any aggregation mode and
   with the dual clip; pure GSPO is ``agg_mode="seq-mean-token-mean", clip_c=None``.
6. Statistics report the low-side and high-side clip fractions separately, each counted only
   where it changes the loss (A < 0 resp. A > 0); verl logs their sum as ``pg_clipfrac``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Literal

import torch

Tensor = torch.Tensor


# --------------------------------------------------------------------------- masked reductions
def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(values[mask == 1])`` over ``dim`` (all dims when None); masked entries are selected
    away, never multiplied, so inf/NaN there does not propagate."""
    selected = torch.where(mask.bool(), values, 0.0)
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(values * mask) / sum(mask)`` over ``dim``; 0 where the mask holds no 1 (a fully
    masked row contributes nothing instead of NaN)."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


# --------------------------------------------------------------------------- advantages
def group_advantages(
    rewards: Tensor,
    groups: int | Sequence[Hashable] | Tensor,
    *,
    eps: float = 1e-6,
    norm_by_std: bool,
) -> Tensor:
    """GRPO outcome advantage per prompt group.

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` with the unbiased (n - 1) std of the group g
    holding sample i; with ``norm_by_std=False`` it is ``r_i - mean_g(r)`` (Dr. GRPO). A group
    whose rewards are all equal gets 0 (0 / eps); a group of one sample gets 0 (departure 1).

    rewards: (N,) scalar reward per response.
    groups: the group size when each prompt's samples are contiguous (``N % size == 0``), or one
        group id per response (any hashables, or an integer tensor), in any order.
    Returns (N,) in ``rewards``' floating dtype.
    """
    assert rewards.dim() == 1, f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}"
    rewards = rewards.detach().to(torch.promote_types(rewards.dtype, torch.float32))
    n = rewards.shape[0]
    assert n > 0, "no rewards to turn into advantages"
    if isinstance(groups, int):
        assert groups >= 1 and n % groups == 0, f"{n} rewards do not split into groups of {groups}"
        group_index = torch.arange(n, device=rewards.device) // groups  # (N,)
    else:
        ids = groups.tolist() if isinstance(groups, Tensor) else list(groups)
        assert len(ids) == n, f"{len(ids)} group ids for {n} rewards"
        code_of: dict[Hashable, int] = {}
        group_index = torch.tensor([code_of.setdefault(g, len(code_of)) for g in ids], device=rewards.device)
    num_groups = int(group_index.max().item()) + 1 if n else 0

    counts = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device).index_add_(
        0, group_index, torch.ones_like(rewards)
    )  # (G,)
    means = torch.zeros_like(counts).index_add_(0, group_index, rewards) / counts  # (G,)
    deviation = rewards - means[group_index]  # (N,)
    if norm_by_std:
        squares = torch.zeros_like(counts).index_add_(0, group_index, deviation.square())
        stds = (squares / (counts - 1).clamp(min=1)).sqrt()  # (G,) unbiased
        deviation = deviation / (stds[group_index] + eps)
    return torch.where(counts[group_index] > 1, deviation, torch.zeros_like(deviation))


def masked_group_advantages(
    rewards: Tensor,
    groups: int | Sequence[Hashable] | Tensor,
    valid: Tensor,
    *,
    eps: float = 1e-6,
    norm_by_std: bool,
) -> Tensor:
    """:func:`group_advantages` over the valid samples only; 0 for the others.

    ``A_i = m_i (r_i - mean_{g,m}(r)) / (std_{g,m}(r) + eps)``, where ``mean_{g,m}`` and the
    unbiased ``std_{g,m}`` run over the samples j of i's group g with ``m_j = 1``: a sample left
    out (an infrastructure failure: its reward is not the model's) neither gets an advantage nor
    moves its group's baseline. A group with fewer than two valid samples gets 0. With every
    ``m_i = 1`` this is :func:`group_advantages` exactly.

    valid: (N,) bool or 0/1, the mask m. Other arguments and the result as :func:`group_advantages`.
    """
    assert valid.shape == rewards.shape, f"valid {tuple(valid.shape)} does not match rewards {tuple(rewards.shape)}"
    n = rewards.shape[0]
    if isinstance(groups, int):
        assert groups >= 1 and n % groups == 0, f"{n} rewards do not split into groups of {groups}"
        ids = (torch.arange(n, device=rewards.device) // groups).tolist()
    else:
        ids = groups.tolist() if isinstance(groups, Tensor) else list(groups)
        assert len(ids) == n, f"{len(ids)} group ids for {n} rewards"
    keep = valid.bool()
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    out = torch.zeros(n, dtype=dtype, device=rewards.device)
    if keep.any():
        kept_ids = [g for g, k in zip(ids, keep.tolist()) if k]
        out[keep] = group_advantages(rewards[keep], kept_ids, eps=eps, norm_by_std=norm_by_std)
    return out


def broadcast_advantages(advantages: Tensor, loss_mask: Tensor) -> Tensor:
    """``A_{i,t} = A_i * mask_{i,t}``: (B,) -> (B, T), zero on tokens outside the loss."""
    assert advantages.dim() == 1 and advantages.shape[0] == loss_mask.shape[0], (
        f"advantages {tuple(advantages.shape)} do not match loss_mask {tuple(loss_mask.shape)}"
    )
    return torch.where(loss_mask.bool(), advantages[:, None], 0.0)


# --------------------------------------------------------------------------- loss aggregation
Count = int | Tensor | None  # a token or sequence count for the whole mini-batch, or None
AggregationFn = Callable[[Tensor, Tensor, Count, Count], Tensor]
LOSS_AGGREGATIONS: dict[str, AggregationFn] = {}


def register_aggregation(name: str) -> Callable[[AggregationFn], AggregationFn]:
    def decorator(fn: AggregationFn) -> AggregationFn:
        assert name not in LOSS_AGGREGATIONS, f"loss aggregation {name!r} registered twice"
        LOSS_AGGREGATIONS[name] = fn
        return fn

    return decorator


def _sequence_denominator(loss_mask: Tensor, global_seq_count: int | Tensor | None) -> Tensor | int:
    if global_seq_count is not None:
        return global_seq_count
    return (loss_mask.bool().sum(dim=-1) > 0).sum().clamp(min=1)


@register_aggregation("token-mean")
def token_mean(
    per_token_loss: Tensor, loss_mask: Tensor, global_token_count: Count = None, global_seq_count: Count = None
) -> Tensor:
    """``sum_{i,t} m_{i,t} l_{i,t} / N_tok``; N_tok = ``global_token_count`` or this batch's count."""
    denominator = global_token_count if global_token_count is not None else loss_mask.bool().sum().clamp(min=1)
    return masked_sum(per_token_loss, loss_mask) / denominator


@register_aggregation("seq-mean-token-mean")
def seq_mean_token_mean(
    per_token_loss: Tensor, loss_mask: Tensor, global_token_count: Count = None, global_seq_count: Count = None
) -> Tensor:
    """``(1/N_seq) sum_i [sum_t m_{i,t} l_{i,t} / sum_t m_{i,t}]`` (GSPO's and GRPO's original form)."""
    per_sequence = masked_mean(per_token_loss, loss_mask, dim=-1)  # (B,)
    return per_sequence.sum() / _sequence_denominator(loss_mask, global_seq_count)


@register_aggregation("seq-mean-token-sum")
def seq_mean_token_sum(
    per_token_loss: Tensor, loss_mask: Tensor, global_token_count: Count = None, global_seq_count: Count = None
) -> Tensor:
    """``(1/N_seq) sum_i sum_t m_{i,t} l_{i,t}``: longer responses weigh more."""
    per_sequence = masked_sum(per_token_loss, loss_mask, dim=-1)  # (B,)
    return per_sequence.sum() / _sequence_denominator(loss_mask, global_seq_count)


def micro_batch_share(micro_batch_sequences: int, mini_batch_sequences: float) -> float:
    """``B_micro / B_mini``: what a micro-batch's own aggregate is weighed by (``grpo.loss_weighting:
    micro_batch_share``, upstream verl's ``dp_actor`` with ``use_dynamic_bsz``: ``loss_scale_factor
    = response_mask.shape[0] / ppo_mini_batch_size``). The mini-batch loss is then
    ``sum_b (B_b / B) agg_b``: with token-mean, a token of micro-batch b weighs ``B_b / (B N_b)``,
    so the tokens of a micro-batch of few long responses weigh less than under one token mean over
    the mini-batch (``mini_batch_tokens``, where every token weighs ``1 / N``).
    ``mini_batch_sequences`` is per rank (the all-rank count / W, as upstream's per-GPU size).
    """
    assert mini_batch_sequences > 0, f"mini_batch_sequences must be positive, got {mini_batch_sequences}"
    return micro_batch_sequences / mini_batch_sequences


def aggregate_loss(
    per_token_loss: Tensor,
    loss_mask: Tensor,
    *,
    mode: str,
    global_token_count: int | Tensor | None = None,
    global_seq_count: int | Tensor | None = None,
) -> Tensor:
    """Reduce a (B, T) loss to a scalar with the registered ``mode`` (``LOSS_AGGREGATIONS``).

    - ``token-mean``: ``sum_{i,t} m l / sum_{i,t} m`` - every loss token of the mini-batch
      weighs the same (the recipe's "T");
    - ``seq-mean-token-mean``: mean over sequences of each sequence's token mean;
    - ``seq-mean-token-sum``: mean over sequences of each sequence's token sum.

    Gradient accumulation. A mini-batch split into micro-batches b = 1..M has the token mean
    ``sum_b S_b / N`` with S_b the masked loss sum of micro-batch b and N the mini-batch's token
    count. Passing ``global_token_count=N`` makes each micro-batch return ``S_b / N``, so the
    *sum* of the micro-batch losses (the gradients torch accumulates) is exactly the mini-batch
    token mean, whatever the micro-batch lengths. Do not divide by M again: DeepSpeed's
    ``engine.backward`` does so by default, so call it with ``scale_wrt_gas=False``. Averaging
    micro-batch token means instead weighs tokens by ``1 / (M N_b)``. Likewise
    ``global_seq_count`` for the sequence modes. Under data parallelism whose all-reduce
    *averages* gradients over W ranks, pass the all-rank count divided by W.
    """
    assert per_token_loss.shape == loss_mask.shape, (
        f"per_token_loss {tuple(per_token_loss.shape)} and loss_mask {tuple(loss_mask.shape)} differ"
    )
    if mode not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {sorted(LOSS_AGGREGATIONS)}")
    for name, count in (("global_token_count", global_token_count), ("global_seq_count", global_seq_count)):
        assert count is None or float(count) > 0, f"{name} must be positive, got {count}"
    return LOSS_AGGREGATIONS[mode](per_token_loss, loss_mask, global_token_count, global_seq_count)


# --------------------------------------------------------------------------- policy loss
def importance_ratio(
    logp: Tensor,
    old_logp: Tensor,
    loss_mask: Tensor,
    *,
    level: Literal["token", "sequence"],
    log_ratio_clamp: float = 20.0,
) -> Tensor:
    """Importance ratio (B, T) of the current to the sampling (old) policy.

    token (PPO/GRPO): ``rho_{i,t} = exp(clamp(logp_{i,t} - old_{i,t}, -c, c))``.

    sequence (GSPO, Zheng et al. 2025, arXiv 2507.18071): the length-normalised sequence ratio
    ``s_i = (pi(y_i|x) / pi_old(y_i|x))^(1/|y_i|) = exp((1/|y_i|) sum_t (logp_{i,t} - old_{i,t}))``,
    the sum and |y_i| running over the loss-mask tokens, used through GSPO-token's
    ``s_{i,t} = sg[s_i] * pi(y_{i,t}) / sg[pi(y_{i,t})]``: its value is s_i at every token and
    its gradient ``s_i * grad logp_{i,t}``, so with equal advantages per sequence and
    ``seq-mean-token-mean`` the objective and gradient equal GSPO's
    ``J = (1/G) sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)``.
    """
    if level == "token":
        return torch.exp(torch.clamp(logp - old_logp, -log_ratio_clamp, log_ratio_clamp))
    if level == "sequence":
        sequence_log_ratio = masked_mean(logp - old_logp, loss_mask, dim=-1).detach()  # (B,)
        sequence_log_ratio = sequence_log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
        return torch.exp(sequence_log_ratio[:, None] + logp - logp.detach())
    raise ValueError(f"unknown ratio_level {level!r}; choose 'token' or 'sequence'")


def behaviour_importance_weight(
    proximal_logp: Tensor,
    behaviour_logp: Tensor,
    loss_mask: Tensor,
    *,
    cap: float,
    level: Literal["token", "sequence"],
    log_ratio_clamp: float = 20.0,
) -> Tensor:
    """Truncated importance weight (B, T), detached, of the proximal to the behaviour policy.

    token: ``w_{i,t} = min(exp(clamp(prox_{i,t} - behav_{i,t}, -c, c)), cap)``.
    sequence: ``w_{i,t} = min(exp(clamp((1/|y_i|) sum_t (prox_{i,t} - behav_{i,t}), -c, c)), cap)``,
    the geometric mean of the token weights over the loss tokens of sequence i, as
    :func:`importance_ratio`'s sequence level, the same at each of its tokens.

    ``prox``: log-probs of the proximal policy (recomputed by the trainer before the update); ``behav``:
    those the engine returned for the policy that sampled. The cap (verl's rollout importance sampling,
    "TIS") bounds the variance a stale sample adds. Positions outside the loss mask get 0, as in
    :func:`broadcast_advantages`: a sum of ``w`` counts loss tokens only, and padding's inf never enters.
    """
    assert proximal_logp.shape == behaviour_logp.shape == loss_mask.shape, (
        f"shapes differ: proximal_logp {tuple(proximal_logp.shape)}, "
        f"behaviour_logp {tuple(behaviour_logp.shape)}, loss_mask {tuple(loss_mask.shape)}"
    )
    assert cap >= 1.0, f"cap must be at least 1 (below it on-policy tokens are scaled down too), got {cap}"
    keep = loss_mask.bool()
    log_weight = torch.where(keep, proximal_logp.detach() - behaviour_logp.detach(), 0.0)  # (B, T)
    if level == "sequence":
        log_weight = masked_mean(log_weight, loss_mask, dim=-1)[:, None].expand_as(log_weight)
    elif level != "token":
        raise ValueError(f"unknown importance weight level {level!r}; choose 'token' or 'sequence'")
    weight = torch.clamp(log_weight.clamp(-log_ratio_clamp, log_ratio_clamp).exp(), max=cap)
    return torch.where(keep, weight, 0.0)


def per_token_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
    log_ratio_clamp: float = 20.0,
    ratio_level: Literal["token", "sequence"],
    behaviour_weight: Tensor | None = None,
    behaviour_weight_cap: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate per token, (B, T), and its statistics; see :func:`policy_loss`."""
    assert logp.shape == old_logp.shape == advantages.shape == loss_mask.shape, (
        f"shapes differ: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, "
        f"advantages {tuple(advantages.shape)}, loss_mask {tuple(loss_mask.shape)}"
    )
    assert clip_c is None or clip_c > 1.0, f"dual-clip constant clip_c must exceed 1, got {clip_c}"
    # Masked positions are replaced by 0 before any arithmetic: whatever sits there (padding
    # log-probs, inf, NaN) then reaches neither the loss nor, through where's backward, the grad.
    keep = loss_mask.bool()
    logp = torch.where(keep, logp, 0.0)
    old_logp = torch.where(keep, old_logp.detach(), 0.0)
    advantages = torch.where(keep, advantages.detach(), 0.0)
    ratio = importance_ratio(logp, old_logp, loss_mask, level=ratio_level, log_ratio_clamp=log_ratio_clamp)  # (B, T)
    unclipped = -advantages * ratio  # (B, T)
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)  # (B, T)
    loss = torch.maximum(unclipped, clipped)  # pessimistic bound of the surrogate
    negative = advantages < 0
    if clip_c is not None:
        # Dual clip: for A < 0 a huge ratio would make the loss unbounded; cap it at -A*c.
        loss = torch.where(negative, torch.minimum(loss, -advantages * clip_c), loss)
    if behaviour_weight is not None:
        assert behaviour_weight.shape == loss_mask.shape and behaviour_weight_cap is not None, (
            f"behaviour_weight {tuple(behaviour_weight.shape)} must match loss_mask {tuple(loss_mask.shape)} "
            f"and come with behaviour_weight_cap (got {behaviour_weight_cap})"
        )
        # After the clip: the weight corrects for the sampler, the clip still bounds the step from pi_prox.
        weight = torch.where(keep, behaviour_weight.detach(), 0.0)
        loss = loss * weight

    with torch.no_grad():
        r = ratio.detach()
        log_ratio = torch.clamp(logp.detach() - old_logp, -log_ratio_clamp, log_ratio_clamp)  # per token
        token_ratio = log_ratio.exp()
        stats = {
            "clip_frac_high": masked_mean(((advantages > 0) & (r > 1.0 + clip_high)).float(), loss_mask),
            "clip_frac_low": masked_mean((negative & (r < 1.0 - clip_low)).float(), loss_mask),
            "dual_clip_frac": masked_mean((negative & (r > clip_c)).float(), loss_mask)
            if clip_c is not None
            else torch.zeros((), device=r.device),
            # KL(pi_old || pi) estimated on tokens sampled from pi_old (Schulman's k1 and k3).
            "approx_kl_k1": masked_mean(-log_ratio, loss_mask),
            "approx_kl_k3": masked_mean(token_ratio - 1.0 - log_ratio, loss_mask),
            "ratio_mean": masked_mean(r, loss_mask),
            "ratio_max": torch.where(keep, r, 0.0).max(),  # ratios are positive: 0 never wins
        }
        if behaviour_weight is not None:
            stats["is_weight_mean"] = masked_mean(weight, loss_mask)
            stats["is_weight_max"] = torch.where(keep, weight, 0.0).max()  # weights are positive: 0 never wins
            stats["is_truncated_frac"] = masked_mean((weight >= behaviour_weight_cap).float(), loss_mask)
    return loss, stats


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
    log_ratio_clamp: float = 20.0,
    ratio_level: Literal["token", "sequence"],
    agg_mode: str,
    global_token_count: int | Tensor | None = None,
    global_seq_count: int | Tensor | None = None,
    behaviour_weight: Tensor | None = None,
    behaviour_weight_cap: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO-TCR policy loss (scalar) and statistics.

    Per token, with rho the importance ratio (:func:`importance_ratio`, token or sequence level):

        l_{i,t} = max(-A_{i,t} rho_{i,t}, -A_{i,t} clip(rho_{i,t}, 1 - clip_low, 1 + clip_high))
        l_{i,t} = min(l_{i,t}, -A_{i,t} clip_c)        if A_{i,t} < 0 and clip_c is not None

    then :func:`aggregate_loss` with ``agg_mode``. The clip bounds the update: for A > 0 and
    rho > 1 + clip_high, and for A < 0 and rho < 1 - clip_low, the loss is constant (zero
    gradient); for A < 0 and rho > clip_c the dual clip makes it constant too.

    Off-policy samples (decoupled PPO, Hilton et al. 2021, arXiv 2110.00641, as AReaL, Fu et al.
    2025, arXiv 2505.24298): with ``behaviour_weight`` w (:func:`behaviour_importance_weight`) the
    loss of each token, after the clip and the dual clip, is

        l_{i,t} = w_{i,t} max(-A rho, -A clip(rho)),  rho = pi_theta / pi_prox,  w = min(pi_prox / pi_behav, cap)

    where pi_prox is the proximal policy (``old_logp``, recomputed before the update) and pi_behav
    the policy that sampled (whose log-probs the engine returned); the truncation at ``cap`` is
    verl's rollout importance sampling (TIS, Yao et al. 2025, "Your efficient RL framework secretly
    brings you off-policy RL training"). w is detached; ``behaviour_weight_cap`` is the cap it used.
    Without a weight (None) the loss is the on-policy one, bit for bit.

    logp: (B, T) log-probs under the current policy (with grad); old_logp: (B, T) under the
    proximal policy (recomputed before the update; on policy, the one that sampled); advantages:
    (B, T) (see :func:`broadcast_advantages`); loss_mask: (B, T), 1 on tokens the model sampled.

    Stats (detached 0-dim tensors, so the caller chooses when to sync the device), means over
    the loss-mask tokens of this call: ``clip_frac_high`` (A > 0, rho > 1 + clip_high),
    ``clip_frac_low`` (A < 0, rho < 1 - clip_low), ``dual_clip_frac`` (A < 0, rho > clip_c),
    ``approx_kl_k1`` = mean(old - logp), ``approx_kl_k3`` = mean(rho - 1 - log rho) with the
    token ratio, ``ratio_mean`` and ``ratio_max`` of the ratio used in the loss; with a
    ``behaviour_weight`` also ``is_weight_mean``, ``is_weight_max`` and ``is_truncated_frac`` (w = cap).
    """
    per_token, stats = per_token_policy_loss(
        logp,
        old_logp,
        advantages,
        loss_mask,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=clip_c,
        log_ratio_clamp=log_ratio_clamp,
        ratio_level=ratio_level,
        behaviour_weight=behaviour_weight,
        behaviour_weight_cap=behaviour_weight_cap,
    )
    loss = aggregate_loss(
        per_token, loss_mask, mode=agg_mode, global_token_count=global_token_count, global_seq_count=global_seq_count
    )
    return loss, stats


# --------------------------------------------------------------------------- KL to a reference
def _kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp


def _kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return 0.5 * (logp - ref_logp).square()


def _kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    log_ref_ratio = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.clamp(log_ref_ratio.exp() - log_ref_ratio - 1.0, -10.0, 10.0)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": _kl_k1, "k2": _kl_k2, "k3": _kl_k3}


def kl_penalty(logp: Tensor, ref_logp: Tensor, *, kind: str) -> Tensor:
    """Per-token estimate (B, T) of KL(pi || pi_ref) on tokens sampled from pi (Schulman 2020).

    With ``d = ref_logp - logp``:  k1 = -d;  k2 = d^2 / 2;  k3 = e^d - d - 1 (non-negative,
    low variance; as verl, d is clamped to [-20, 20] and k3 to [-10, 10] for stability).
    Used by the GRPO-T baseline as ``loss += beta * aggregate_loss(kl_penalty(...), mask, mode=...)``.
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; choose one of {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[kind](logp, ref_logp)


# --------------------------------------------------------------------------- from logits
def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy (B, T) of softmax(logits) for (B, T, V) finite logits.

    ``H = logsumexp(z) - sum_v softmax(z)_v z_v`` on logits shifted by their row max (H is
    shift-invariant), so neither term overflows nor cancels large values. Rows are processed
    one sequence at a time to bound the temporaries to (T, V).
    """
    assert logits.dim() == 3, f"logits must be (B, T, V), got shape {tuple(logits.shape)}"
    rows = []
    for row in logits:  # (T, V)
        row = row.float() if row.dtype in (torch.float16, torch.bfloat16) else row
        shifted = row - row.detach().amax(dim=-1, keepdim=True)
        probs = torch.softmax(shifted, dim=-1)
        rows.append(torch.logsumexp(shifted, dim=-1) - torch.linalg.vecdot(probs, shifted))
    return torch.stack(rows)


def token_logprobs(logits: Tensor, labels: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(z / temperature)[label]`` per position: (B, T, V), (B, T) -> (B, T).

    ``logp_{i,t} = z_{i,t,y} / tau - logsumexp_v(z_{i,t,v} / tau)``. Computed one sequence at a
    time: no full (B, T, V) log-softmax is materialised, and the temperature division and the
    float32 upcast of half-precision logits (logsumexp in bf16 loses ~2 digits) allocate one
    (T, V) row at a time. Under autograd the backward still needs softmax(z) per row; without
    grad (old/ref log-prob recomputation) the peak extra memory is one row.
    ``temperature`` must match the sampler's so that old_logp and the sampling log-probs agree.
    """
    assert logits.dim() == 3 and labels.shape == logits.shape[:2], (
        f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not match as (B, T, V), (B, T)"
    )
    assert temperature > 0, f"temperature must be positive, got {temperature}"
    rows = []
    for row, row_labels in zip(logits, labels):  # (T, V), (T,)
        row = row.float() if row.dtype in (torch.float16, torch.bfloat16) else row
        if temperature != 1.0:
            row = row / temperature
        picked = row.gather(-1, row_labels[:, None].long()).squeeze(-1)  # (T,)
        rows.append(picked - torch.logsumexp(row, dim=-1))
    return torch.stack(rows)


# Elements of one float32 block of the chunked log-prob and entropy (64 MB): bounds the temporaries
# of a (N, V) chunk of 16-bit logits to one block instead of a float32 copy of the whole chunk.
LOGIT_BLOCK_ELEMENTS = 2**24


def _row_blocks(rows: int, vocabulary: int) -> list[slice]:
    step = max(1, LOGIT_BLOCK_ELEMENTS // max(vocabulary, 1))
    return [slice(start, start + step) for start in range(0, rows, step)]


class _SampledTokenLogprob(torch.autograd.Function):
    """``log softmax(z / tau)[y]`` of (N, V) logits, one float32 block of rows at a time.

    Forward: ``logp_n = z_{n,y_n} / tau - lse_n`` with ``lse_n = logsumexp_v(z_{n,v} / tau)``.
    Backward: ``d logp_n / d z_{n,v} = ([v = y_n] - softmax(z_n / tau)_v) / tau``, from the saved
    logits (their own dtype) and ``lse`` (N,), written into a gradient of the logits' dtype. What
    autograd of the unfused ops keeps instead is a float32 copy of all the logits and of their
    softmax.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, temperature: float) -> Tensor:
        out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        for block in _row_blocks(*logits.shape):
            z = logits[block].float() / temperature  # (b, V)
            lse[block] = torch.logsumexp(z, dim=-1)
            out[block] = z.gather(-1, labels[block, None]).squeeze(-1) - lse[block]
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for block in _row_blocks(*logits.shape):
            g = grad_out[block].float()[:, None]  # (b, 1)
            probs = torch.exp(logits[block].float() / ctx.temperature - lse[block, None])  # (b, V)
            part = -probs * g
            part.scatter_add_(-1, labels[block, None], g)
            grad[block] = (part / ctx.temperature).to(grad.dtype)
        return grad, None, None


def sampled_token_logprobs(logits: Tensor, labels: Tensor, temperature: float = 1.0) -> Tensor:
    """:func:`token_logprobs` of (N, V) logits and (N,) labels, (N,) float32, computed in float32
    blocks of rows (``LOGIT_BLOCK_ELEMENTS``) with its own backward: the peak extra memory is one
    block, not a float32 copy of the logits (a 4,096 x 151,936 chunk: 2.5 GB per copy)."""
    assert logits.dim() == 2 and labels.shape == logits.shape[:1], (
        f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not match as (N, V), (N,)"
    )
    assert temperature > 0, f"temperature must be positive, got {temperature}"
    return _SampledTokenLogprob.apply(logits, labels.long(), float(temperature))


@torch.no_grad()
def blockwise_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """:func:`entropy_from_logits` of ``softmax(z / tau)`` for (N, V) logits without gradient,
    (N,) float32, one float32 block of rows at a time (no float32 copy of all the logits)."""
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for block in _row_blocks(*logits.shape):
        out[block] = entropy_from_logits((logits[block].float() / temperature)[None])[0]
    return out
