"""grpo.share_prompts: each prompt's forward once for its n samples, on real tiny models.

The shared forward must be the same function of the weights as one forward per sample: the
log-probs, entropies and gradients of the actor, and a whole DeepSpeed update (ZeRO-0 and 2),
agree with the unshared path to float round-off, for prompts of different lengths in one
micro-batch and for groups that the token budget cuts apart.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.grpo_updates import deepspeed_update, uneven_samples
from helpers.tiny_models import qwen3_for_updates

from agentrl.config import ConfigError, check_cross_keys, load_config
from agentrl.grpo import algorithm as alg
from agentrl.grpo.batching import PolicySample, collate, pack_prompt_groups, prompt_groups
from agentrl.grpo.policy import ResponseLogProbs


def _grouped_samples(vocab: int, seed: int = 0) -> list[PolicySample]:
    """Two prompt groups (prompts of 6 and 4 tokens) of 3 and 2 samples; masks with tool gaps."""
    return uneven_samples(vocab, ((6, (9, 3, 5)), (4, (14, 1))), seed)


def test_prompt_groups_are_runs_of_the_same_prompt_and_the_packer_keeps_them_whole():
    samples = _grouped_samples(vocab=50)
    assert prompt_groups(samples, range(5)) == [[0, 1, 2], [3, 4]]
    assert prompt_groups(samples, [0, 3, 1]) == [[0], [3], [1]]  # runs, not sets
    responses = [s.response_length for s in samples]  # 9 3 5 | 14 1
    assert pack_prompt_groups([[0, 1, 2], [3, 4]], [6, 4], responses, 10_000) == [[3, 4, 0, 2, 1]]
    # 6 + 3 x 9 = 33 and 4 + 2 x 14 = 32: each group fits alone, not both (2 x 6 + 5 x 14 = 82).
    assert pack_prompt_groups([[0, 1, 2], [3, 4]], [6, 4], responses, 40) == [[3, 4], [0, 2, 1]]
    # 20 cuts the first group into runs that fit (6 + 9, 6 + 2 x 5), the 14-token one runs alone.
    packed = pack_prompt_groups([[0, 1, 2], [3, 4]], [6, 4], responses, 20)
    assert sorted(i for micro in packed for i in micro) == list(range(5))
    for micro in packed:
        runs = prompt_groups(samples, micro)
        cost = len(runs) * max(samples[r[0]].prompt_length for r in runs)
        cost += len(micro) * max(responses[i] for i in micro)
        assert len(micro) == 1 or cost <= 20, (micro, cost)
    assert [0] in packed and [3] in packed


def test_the_shared_batch_holds_each_prompt_once():
    samples = _grouped_samples(vocab=50)
    batch = collate(samples, pad_token_id=0, share_prompts=True)
    shared = batch.shared
    assert shared.prompt_ids.shape == (2, 6) and shared.row_prompt.tolist() == [0, 0, 0, 1, 1]
    assert shared.prompt_mask.sum(1).tolist() == [6, 4]
    assert shared.prompt_ids[1, :4].tolist() == samples[3].prompt_ids
    assert shared.response_ids.shape == batch.loss_mask.shape == (5, 14)
    assert shared.response_ids[3].tolist() == samples[3].input_ids[4:]
    assert batch.num_tokens == 2 * 6 + 5 * 14 < collate(samples, pad_token_id=0).num_tokens == 5 * 18


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompt_logprobs_entropies_and_gradients_equal_one_forward_per_sample(temperature):
    samples = _grouped_samples(vocab=50)
    results = []
    for share in (False, True):
        model = qwen3_for_updates()
        batch = collate(samples, pad_token_id=0, share_prompts=share)
        logp, entropy = ResponseLogProbs(model, logit_chunk_tokens=7, temperature=temperature)(
            batch, with_entropy=True, entropy_grad=True
        )
        loss = -alg.masked_sum(logp * batch.advantages, batch.loss_mask) - 0.1 * alg.masked_sum(
            entropy, batch.loss_mask
        )
        loss.backward()
        mask = batch.loss_mask.bool()
        results.append((logp[mask], entropy[mask], {k: p.grad.clone() for k, p in model.named_parameters()}))
    (logp, entropy, grads), (shared_logp, shared_entropy, shared_grads) = results
    torch.testing.assert_close(shared_logp, logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared_entropy, entropy, atol=1e-5, rtol=1e-5)
    for name, grad in grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_a_deepspeed_update_with_shared_prompts_equals_the_unshared_one(zero_stage, monkeypatch):
    """The trainer's own plan, micro-batches and DeepSpeed steps: the first optimizer step's
    gradients, the norms and the weights after one update, with budgets that keep the groups
    together and that cut them apart."""
    from helpers.rollout import random_policy

    model_dir = random_policy()
    every = _grouped_samples(vocab=300)
    samples = [every[0], every[1], every[3], every[4]]  # n = 2: prompt 6 (responses 9, 3), prompt 4 (14, 1)
    overrides = {"deepspeed": {"zero_stage": zero_stage}}
    plain = deepspeed_update(model_dir, copy.deepcopy(samples), 10_000, overrides, monkeypatch)
    for budget in (10_000, 20):
        monkeypatch.undo()
        shared = deepspeed_update(
            model_dir, copy.deepcopy(samples), budget, {**overrides, "share_prompts": True}, monkeypatch
        )
        plan, stats, norms, params, cfg, grads = shared
        if budget == 20:
            assert len(plan[0].micro_batches) > 2, "the budget should cut the groups apart"
        for name, grad in plain[5].items():
            torch.testing.assert_close(grads[name], grad, atol=1e-7, rtol=1e-4, msg=name)
        assert norms == pytest.approx(plain[2], rel=1e-5)
        assert stats["actor/pg_loss"] == pytest.approx(plain[1]["actor/pg_loss"], abs=1e-6)
        for name, value in plain[3].items():
            torch.testing.assert_close(params[name], value, atol=0.05 * cfg.grpo.lr, rtol=0, msg=name)


def test_sharing_prompts_with_gradient_checkpointing_is_refused_naming_both_keys():
    """At workflow load and by the GRPO stage (both run check_cross_keys)."""
    refused = load_config({"grpo": {"share_prompts": True, "deepspeed": {"gradient_checkpointing": True}}})
    with pytest.raises(ConfigError, match=r"grpo\.share_prompts with grpo\.deepspeed\.gradient_checkpointing"):
        check_cross_keys(refused)
    check_cross_keys(load_config({"grpo": {"share_prompts": True}}))
