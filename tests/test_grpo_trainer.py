"""The GRPO trainer's parts on real small inputs: variants, batching, the actor's log-probs, the
prompt order, metrics, and the DeepSpeed update checked against a plain-torch reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.grpo_updates import deepspeed_update
from helpers.tiny_models import qwen3_for_updates

from agentrl.config import ConfigError, load_config, load_schema
from agentrl.data.records import Problem
from agentrl.grpo import algorithm as alg
from agentrl.grpo.batching import PolicySample, collate, pack_micro_batches, unpad_response
from agentrl.grpo.metrics import TokenWeightedStats, TrajectorySummary, rollout_metrics
from agentrl.grpo.policy import ResponseLogProbs
from agentrl.grpo.prompts import PromptSampler
from agentrl.grpo.variants import VARIANTS, resolve_algorithm

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- variants
def test_variant_registry_matches_the_schema_enum():
    enum = load_schema()["properties"]["grpo"]["properties"]["variant"]["enum"]
    assert sorted(enum) == sorted(VARIANTS)


def test_default_variant_is_the_recipe():
    settings = resolve_algorithm(load_config({}).grpo)
    assert (settings.loss_agg_mode, settings.ratio_level) == ("token-mean", "token")
    assert (settings.clip_low, settings.clip_high, settings.clip_c) == (0.2, 0.28, 10.0)
    assert settings.kl_coef == 0 and not settings.uses_reference and settings.entropy_coef == 0
    assert settings.overlong_shaping and settings.norm_adv_by_std


def test_variants_differ_as_the_paper_says():
    get = lambda name: resolve_algorithm(load_config({"grpo": {"variant": name}}).grpo)  # noqa: E731
    t, scr, paper, vanilla = get("grpo_t"), get("grpo_scr"), get("grpo_tcr_paper"), get("grpo")
    assert t.loss_agg_mode == "token-mean" and t.clip_high == 0.2 and t.uses_reference and not t.overlong_shaping
    assert scr.ratio_level == "sequence" and (scr.clip_low, scr.clip_high) == (3e-4, 4e-4) and scr.overlong_shaping
    assert paper.clip_high == 0.315 and paper.loss_agg_mode == "token-mean"
    assert vanilla.loss_agg_mode == "seq-mean-token-mean" and vanilla.uses_reference and vanilla.clip_c is None


def test_explicit_overrides_win_and_clip_c_zero_turns_dual_clip_off():
    cfg = load_config({"grpo": {"variant": "grpo_t", "algorithm": {"clip_high": 0.3, "kl_coef": 0, "clip_c": 0}}})
    settings = resolve_algorithm(cfg.grpo)
    assert settings.clip_high == 0.3 and not settings.uses_reference and settings.clip_c is None
    assert settings.clip_low == 0.2  # not overridden: the variant's


def test_bad_dual_clip_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="grpo.algorithm.clip_c"):
        resolve_algorithm(load_config({"grpo": {"algorithm": {"clip_c": 0.5}}}).grpo)


def test_ablation_presets_load_and_select_their_variant():
    import yaml

    for name in ("grpo", "grpo_t", "grpo_scr", "grpo_tcr", "grpo_tcr_paper"):
        raw = yaml.safe_load((REPO / "presets" / "ablations" / f"{name}.yaml").read_text())
        assert resolve_algorithm(load_config(raw).grpo) == VARIANTS[name]
    raw = yaml.safe_load((REPO / "presets" / "ablations" / "dynamic_sampling.yaml").read_text())
    assert load_config(raw).grpo.dynamic_sampling.enable


# --------------------------------------------------------------------------- batching
def test_micro_batches_respect_the_token_budget_and_cover_every_sample():
    lengths = [5, 40, 12, 12, 3, 90, 7, 20]
    groups = pack_micro_batches(lengths, token_budget=48)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        assert len(group) == 1 or len(group) * max(lengths[i] for i in group) <= 48
    assert [5] in groups  # the 90-token sample is alone: it cannot be split
    assert pack_micro_batches(lengths, 10_000) == [[5, 1, 7, 2, 3, 6, 0, 4]]


def _sample(prompt, response, mask, advantage=0.5):
    return PolicySample(list(prompt) + list(response), len(prompt), list(mask), [-1.0] * len(mask), advantage)


def test_collate_lays_out_the_response_frame():
    samples = [_sample([5, 6, 7], [8, 9], [1, 0], 2.0), _sample([5], [10, 11, 12], [1, 1, 1], -1.0)]
    batch = collate(samples, pad_token_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 10, 11, 12, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch.loss_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert batch.advantages.tolist() == [[2.0, 0.0, 0.0], [-1.0, -1.0, -1.0]]
    assert batch.response_start.tolist() == [3, 1]
    assert unpad_response(batch.sampling_logp, samples) == [[-1.0, -1.0], [-1.0, -1.0, -1.0]]


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_actor_logprobs_equal_the_full_forward(chunk):
    model = qwen3_for_updates()
    samples = [_sample([1, 2, 3], [4, 5, 6, 7], [1, 1, 0, 1]), _sample([9, 8], [7, 6], [1, 1])]
    batch = collate(samples, pad_token_id=0)
    actor = ResponseLogProbs(model, logit_chunk_tokens=chunk, temperature=0.7)
    logp, entropy = actor(batch, with_entropy=True)
    for row, sample in enumerate(samples):
        ids = torch.tensor([sample.input_ids])
        logits = model(input_ids=ids).logits[0] / 0.7  # (L, V)
        start, count = sample.prompt_length, sample.response_length
        expected = torch.log_softmax(logits[start - 1 : start - 1 + count], -1).gather(
            -1, ids[0, start : start + count, None]
        )[:, 0]
        # computed at the loss-mask positions only (every consumer reads them through the mask), 0 elsewhere
        mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
        assert (logp[row, :count][~mask] == 0).all() and (entropy[row, :count][~mask] == 0).all()
        torch.testing.assert_close(logp[row, :count][mask], expected[mask], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            entropy[row, :count][mask],
            alg.entropy_from_logits(logits[None, start - 1 : start - 1 + count])[0][mask],
            atol=1e-5,
            rtol=1e-5,
        )


def test_actor_gradients_through_checkpointed_chunks_equal_unchunked():
    grads = []
    for chunk in (2, 1000):
        model = qwen3_for_updates()
        batch = collate([_sample([1, 2, 3], [4, 5, 6, 7], [1, 1, 0, 1])], pad_token_id=0)
        logp, _ = ResponseLogProbs(model, logit_chunk_tokens=chunk, temperature=1.0)(batch)
        alg.masked_sum(logp, batch.loss_mask).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------- prompt order
def _problems(count):
    return [
        Problem(f"p{i}", "embedded-arith", [{"role": "user", "content": f"Compute {i} + 1."}], "math", str(i + 1))
        for i in range(count)
    ]


def test_prompt_sampler_uses_each_problem_once_per_epoch_and_crosses_epochs():
    sampler = PromptSampler(_problems(10), seed=3)
    first = [p.id for _ in range(3) for p in sampler.next_batch(3)]  # 9 of epoch 0
    crossing = [p.id for p in sampler.next_batch(3)]  # 1 of epoch 0 + 2 of epoch 1
    assert len(set(first + crossing[:1])) == 10
    assert sampler.epoch == 1 and sampler.offset == 2
    assert crossing[1:] == [sampler.problems[i].id for i in sampler.order(1)[:2]]
    assert list(sampler.order(0)) != list(sampler.order(1))  # reshuffled per epoch


def test_prompt_sampler_state_round_trip_continues_the_same_order():
    a = PromptSampler(_problems(7), seed=1)
    a.next_batch(5)
    b = PromptSampler(_problems(7), seed=1)
    b.load_state_dict(a.state_dict())
    assert [p.id for p in a.next_batch(6)] == [p.id for p in b.next_batch(6)]
    with pytest.raises(ValueError, match="RL data or the seed changed"):
        PromptSampler(_problems(8), seed=1).load_state_dict(a.state_dict())


# --------------------------------------------------------------------------- metrics
def test_rollout_metrics_on_hand_made_trajectories():
    summaries = [
        TrajectorySummary(100, 60, 3, 2, 1, "stop", 1.0, True, 0.0, 1.0, "embedded-arith"),
        TrajectorySummary(128, 128, 1, 0, 0, "length", -1.5, False, -0.5, -1.0, "embedded-arith"),
        TrajectorySummary(90, 80, 1, 0, 0, "stop", -1.0, False, 0.0, 0.0, "embedded-code"),
    ]
    m = rollout_metrics(summaries, max_response_tokens=128)
    assert m["rollout/reward_mean"] == pytest.approx(-0.5) and m["rollout/acc_mean"] == pytest.approx(1 / 3)
    assert m["rollout/acc/embedded-arith"] == 0.5 and m["rollout/acc/embedded-code"] == 0.0
    assert m["rollout/response_clip_share"] == pytest.approx(1 / 3) and m["rollout/response_length_max"] == 128
    assert m["rollout/tool_calls_mean"] == pytest.approx(2 / 3) and m["rollout/tool_success_rate"] == 0.5
    assert m["rollout/overlong_penalty_mean"] == pytest.approx(-0.5 / 3) and m["rollout/turns_mean"] == pytest.approx(
        5 / 3
    )


def test_token_weighted_stats_merge_over_ranks():
    a, b = TokenWeightedStats(), TokenWeightedStats()
    a.add({"x": 1.0}, tokens=3, maxima={"m": 2.0})
    b.add({"x": 3.0}, tokens=1, maxima={"m": 5.0})
    assert TokenWeightedStats.merge([a.state(), b.state()]) == {"x": 1.5, "m": 5.0}


# --------------------------------------------------------------------------- the update on DeepSpeed
def _reference_update(model_dir: Path, samples, cfg):
    """The same update in plain torch: one forward of the whole mini-batch, token mean, clip, AdamW."""
    from agentrl.training.model import load_causal_lm

    model = load_causal_lm(model_dir, device=torch.device("cpu"))
    actor = ResponseLogProbs(model, logit_chunk_tokens=10_000, temperature=1.0)
    batch = collate(samples, pad_token_id=0)
    logp, _ = actor(batch)
    settings = resolve_algorithm(cfg.grpo)
    loss, _ = alg.policy_loss(
        logp,
        logp.detach(),
        batch.advantages,
        batch.loss_mask,
        clip_low=settings.clip_low,
        clip_high=settings.clip_high,
        clip_c=settings.clip_c,
        ratio_level=settings.ratio_level,
        agg_mode=settings.loss_agg_mode,
    )
    loss.backward()
    grads = {k: v.grad.clone() for k, v in model.named_parameters()}
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grpo.grad_clip)
    torch.optim.AdamW(
        model.parameters(), lr=cfg.grpo.lr, betas=tuple(cfg.grpo.betas), eps=1e-8, weight_decay=cfg.grpo.weight_decay
    ).step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}, float(norm), grads


def _random_samples(vocab: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for i, (prompt_len, response_len) in enumerate([(6, 9), (4, 3), (7, 14), (5, 6)]):
        ids = torch.randint(5, vocab, (prompt_len + response_len,), generator=generator).tolist()
        mask = (torch.rand(response_len, generator=generator) > 0.3).long().tolist()
        mask[0] = 1
        samples.append(PolicySample(ids, prompt_len, mask, [0.0] * response_len, [1.0, -1.0, 0.7, -0.7][i]))
    return samples


@pytest.mark.parametrize(("variant", "zero_stage"), [("grpo_tcr", 0), ("grpo_scr", 0), ("grpo_tcr", 2)])
def test_deepspeed_update_equals_the_plain_torch_update_whatever_the_micro_batches(variant, zero_stage, monkeypatch):
    """Micro-batch losses divided by the mini-batch token count and summed (scale_wrt_gas=False)
    give the gradient of one forward over the whole mini-batch, however the batch is packed."""
    from helpers.rollout import random_policy

    model_dir = random_policy()
    samples = _random_samples(vocab=300)
    overrides = {"variant": variant, "deepspeed": {"zero_stage": zero_stage}}
    one_plan, one_stats, one_norms, one_params, cfg, one_grads = deepspeed_update(
        model_dir, samples, 10_000, overrides, monkeypatch
    )
    # 14 tokens: every sample alone, packed or padded
    many_plan, _, many_norms, many_params, _, many_grads = deepspeed_update(
        model_dir, samples, 14, overrides, monkeypatch
    )
    assert (
        len(one_plan[0].micro_batches) == 1 and len(many_plan[0].micro_batches) == 4
    )  # one micro-batch vs one per sample
    reference, reference_norm, reference_grads = _reference_update(model_dir, samples, cfg)
    for name, grad in reference_grads.items():
        torch.testing.assert_close(one_grads[name], grad, atol=1e-7, rtol=1e-4, msg=name)
        torch.testing.assert_close(many_grads[name], grad, atol=1e-7, rtol=1e-4, msg=name)
    assert one_norms[0] == pytest.approx(reference_norm, rel=1e-5)
    assert many_norms[0] == pytest.approx(reference_norm, rel=1e-5)
    # Adam's first step is lr * g / (|g| + eps): float noise in near-zero gradients moves a weight
    # by up to lr, so the parameters agree to a few percent of the step, not to float precision.
    for name, value in reference.items():
        torch.testing.assert_close(one_params[name], value, atol=0.05 * cfg.grpo.lr, rtol=0, msg=name)
        torch.testing.assert_close(many_params[name], value, atol=0.05 * cfg.grpo.lr, rtol=0, msg=name)
    # old_logp was recomputed on the update's own micro-batches: the first mini-batch starts on-policy.
    assert one_stats["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert one_stats["actor/clip_frac_high"] == 0 and one_stats["actor/clip_frac_low"] == 0


def _with_advantages(samples, advantages):
    for sample, advantage in zip(samples, advantages):
        sample.advantage = advantage
    return samples


@pytest.mark.parametrize(
    ("advantages", "mini_batch_prompts", "ran"),
    [
        ([0.0, 0.0, 0.7, -0.7], 2, [[2, 3]]),  # one uniform group: its samples are skipped
        ([0.0, 0.0, 0.0, 0.0], 2, [[0, 1, 2, 3]]),  # nothing to train in the first mini-batch: it runs
        ([0.7, -0.7, 0.0, 0.0], 1, [[0, 1], []]),  # a later mini-batch with nothing: one padding micro-batch
    ],
    ids=["one-uniform-group", "all-uniform-first-mini-batch", "uniform-second-mini-batch"],
)
def test_zero_advantage_samples_skip_the_forward_with_the_same_update(advantages, mini_batch_prompts, ran, monkeypatch):
    """A sample of advantage 0 adds no gradient: skipping its forward and backward while its
    tokens still count in the token-mean denominator gives the same gradients, norms and weights;
    the first mini-batch always runs its forward (the mismatch is measured there), and every
    mini-batch takes its optimizer step, a zero-gradient one where nothing trains."""
    from helpers.rollout import random_policy

    model_dir = random_policy()
    samples = _with_advantages(_random_samples(vocab=300, seed=2), advantages)
    runs = {
        skip: deepspeed_update(
            model_dir, samples, 14, {"skip_zero_advantage": skip, "mini_batch_prompts": mini_batch_prompts}, monkeypatch
        )
        for skip in (False, True)
    }
    (full_plan, full_stats, full_norms, full_params, cfg, full_grads) = runs[False]
    (skip_plan, skip_stats, skip_norms, skip_params, _, skip_grads) = runs[True]
    assert [mini.members for mini in skip_plan] == [mini.members for mini in full_plan]
    assert [sorted(i for micro in mini.micro_batches for i in micro) for mini in skip_plan] == ran
    assert all(mini.micro_batches for mini in skip_plan)  # a padding micro-batch where nothing runs
    assert sum(len(mini.micro_batches) for mini in full_plan) == 4  # one per sample without the skip
    assert len(full_norms) == len(skip_norms) == len(ran)  # every optimizer step is taken either way
    assert skip_norms == pytest.approx(full_norms, rel=1e-5, abs=1e-12)
    for name, grad in full_grads.items():
        torch.testing.assert_close(skip_grads[name], grad, atol=1e-7, rtol=1e-4, msg=name)
    for name, value in full_params.items():
        torch.testing.assert_close(skip_params[name], value, atol=0.05 * cfg.grpo.lr, rtol=0, msg=name)
    assert skip_stats["actor/pg_loss"] == pytest.approx(full_stats["actor/pg_loss"], abs=1e-7)
    if not any(advantages):
        assert full_norms == [0.0]


def test_zero_advantage_samples_train_where_they_have_a_gradient(monkeypatch):
    """With a KL term (grpo_t) a sample of advantage 0 still has a gradient: none is skipped."""
    from helpers.rollout import random_policy

    model_dir = random_policy()
    samples = _with_advantages(_random_samples(vocab=300, seed=2), [0.0, 0.0, 0.7, -0.7])
    plan, *_ = deepspeed_update(model_dir, samples, 20, {"variant": "grpo_t", "skip_zero_advantage": True})
    assert sorted(i for micro in plan[0].micro_batches for i in micro) == [0, 1, 2, 3]


def test_kl_variant_measures_the_distance_to_the_reference_model():
    from helpers.rollout import random_policy

    model_dir = random_policy()
    samples = _random_samples(vocab=300, seed=1)
    # Two mini-batches: the first starts at the reference (KL 0), the second after one update.
    _, stats, norms, _, _, _ = deepspeed_update(
        model_dir, samples, 10_000, {"variant": "grpo_t", "mini_batch_prompts": 1, "lr": 1e-2}
    )
    assert len(norms) == 2
    assert stats["actor/kl_ref"] > 0


def test_batch_sizes_that_do_not_split_over_the_ranks_are_a_config_error():
    from agentrl.grpo.step import Components, GrpoStep
    from agentrl.training.deepspeed_engine import DistributedContext

    cfg = load_config({"grpo": {"batch_prompts": 6, "mini_batch_prompts": 3}})
    two_ranks = DistributedContext(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    with pytest.raises(
        ConfigError, match=r"grpo.mini_batch_prompts \(3\) must be multiples of the process count \(2\)"
    ):
        GrpoStep(Components(cfg, resolve_algorithm(cfg.grpo), two_ranks, None, None, None, None, None, 0))
