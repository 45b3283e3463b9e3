"""grpo.old_logprobs: the engine's sampling log-probs stand in for the recomputation pass exactly
where they equal it (the fp32 hf engine sharing the actor's module, no top-p/top-k), checked on
a real tiny model: the values, the forward passes run, and one update's gradients."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from agentrl.config import load_config
from agentrl.grpo.batching import PolicySample
from agentrl.grpo.policy import ResponseLogProbs, old_logprobs_source
from agentrl.grpo.variants import resolve_algorithm


# --------------------------------------------------------------------------- the resolution
@pytest.mark.parametrize(
    ("rollout", "dtype", "expected"),
    [
        ({}, torch.float32, "engine"),  # the embedded default
        ({"temperature": 0.7}, torch.float32, "engine"),  # the actor divides by T too
        ({"top_k": 0}, torch.float32, "engine"),  # vLLM's spelling of "off"
        ({}, torch.bfloat16, "recompute"),
        ({"top_p": 0.9}, torch.float32, "recompute"),
        ({"top_k": 20}, torch.float32, "recompute"),
        ({"engine": "vllm"}, torch.float32, "recompute"),
    ],
)
def test_auto_uses_the_engine_only_where_its_log_probs_are_the_actors(rollout, dtype, expected):
    cfg = load_config({"rollout": rollout})
    assert cfg.grpo.old_logprobs == "auto"
    assert old_logprobs_source("auto", cfg.rollout, dtype) == expected


def test_explicit_modes_are_kept():
    rollout = load_config({"rollout": {"engine": "vllm", "top_p": 0.5}}).rollout
    assert old_logprobs_source("engine", rollout, torch.bfloat16) == "engine"
    assert old_logprobs_source("recompute", load_config({}).rollout, torch.float32) == "recompute"


# --------------------------------------------------------------------------- on a real tiny model
def _step(model_dir: Path, rollout: dict, old_logprobs: str, monkeypatch):
    """A GRPO step's parts on DeepSpeed (2 prompts x 2 samples, 2 mini-batches, so the single-pass
    shortcut does not apply) with the hf engine sharing the actor; records the first optimizer
    step's gradients and counts the actor's forwards without gradients (the recomputation)."""
    from agentrl.grpo import step as grpo_step
    from agentrl.grpo.step import Components, GrpoStep
    from agentrl.grpo.trainer import GrpoPaths, build_engine
    from agentrl.rollout.hf_engine import HFEngine
    from agentrl.training import deepspeed_engine as dse
    from agentrl.training.model import load_causal_lm

    cfg = load_config(
        {
            "rollout": {"max_response_tokens": 16, **rollout},
            "grpo": {"n": 2, "batch_prompts": 2, "mini_batch_prompts": 1, "lr": 1e-3, "old_logprobs": old_logprobs},
        }
    )
    grads: dict[str, torch.Tensor] = {}
    real_step = grpo_step.step_with_grad_norm

    def recording_step(engine):
        from deepspeed.utils import safe_get_full_grad

        if not grads:
            grads.update({k: safe_get_full_grad(v).clone() for k, v in engine.module.model.named_parameters()})
        return real_step(engine)

    monkeypatch.setattr(grpo_step, "step_with_grad_norm", recording_step)
    ctx = dse.init_distributed()
    paths = GrpoPaths(model_dir, *(Path("-"),) * 5, dse.find_deepspeed_config(0))
    actor = ResponseLogProbs(
        load_causal_lm(model_dir, device=ctx.device), logit_chunk_tokens=64, temperature=cfg.rollout.temperature
    )
    engine = build_engine(actor, cfg, paths, ctx, torch.float32, steps=1)
    source = old_logprobs_source(cfg.grpo.old_logprobs, cfg.rollout, next(actor.parameters()).dtype)
    rollout_engine = HFEngine(engine.module.model, pad_token_id=0, batch_size=8)
    settings = resolve_algorithm(cfg.grpo)
    parts = Components(cfg, settings, ctx, engine, None, rollout_engine, None, None, 0, old_logprobs=source)
    no_grad_forwards = []
    actor.register_forward_hook(lambda *_: no_grad_forwards.append(1) if not torch.is_grad_enabled() else None)
    return GrpoStep(parts), rollout_engine, grads, no_grad_forwards


def _rollouts(rollout_engine, params) -> list[PolicySample]:
    """Real samples of the engine: 2 prompts x 2, seeded (the same in every call)."""
    prompts = [[11, 12, 13, 14, 15], [21, 22, 23]]
    outputs = rollout_engine.generate([p for p in prompts for _ in range(2)], params, seeds=[7, 8, 9, 10])
    return [
        PolicySample(list(p) + out.token_ids, len(p), [1] * len(out.token_ids), list(out.logprobs), adv)
        for p, out, adv in zip([p for p in prompts for _ in range(2)], outputs, [1.0, -1.0, 0.5, -0.5])
    ]


def _run(model_dir, rollout, mode, monkeypatch):
    from agentrl.rollout import SamplingParams

    step, rollout_engine, grads, forwards = _step(model_dir, rollout, mode, monkeypatch)
    samples = _rollouts(rollout_engine, SamplingParams.from_config(step.cfg.rollout, seed=0))
    plan = step.plan(2, samples)
    assert len(plan) == 2, "two mini-batches: the single-pass shortcut must not hide the recomputation"
    mismatch = step.recompute_logprobs(samples, plan)
    old = [list(s.old_logp) for s in samples]
    stats, norms, _ = step.update(copy.deepcopy(samples), plan)
    return step, samples, old, stats, norms, grads, len(forwards), mismatch


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_auto_on_the_fp32_hf_engine_skips_the_pass_with_the_same_update(temperature, monkeypatch):
    from helpers.rollout import random_policy

    from agentrl.grpo.metrics import TokenWeightedStats

    model_dir = random_policy()
    rollout = {"temperature": temperature}
    auto = _run(model_dir, rollout, "auto", monkeypatch)
    recompute = _run(model_dir, rollout, "recompute", monkeypatch)
    assert auto[0].parts.old_logprobs == "engine" and recompute[0].parts.old_logprobs == "recompute"
    assert [s.input_ids for s in auto[1]] == [s.input_ids for s in recompute[1]], "seeded rollouts differ"
    assert all(len(s.input_ids) > s.prompt_length + 1 for s in auto[1])
    # The old log-probs the update uses: the engine's, equal to the actor's recomputed ones.
    for engine_row, actor_row in zip(auto[2], recompute[2]):
        torch.testing.assert_close(torch.tensor(engine_row), torch.tensor(actor_row), atol=1e-5, rtol=0)
    # The recomputation forward ran once per micro-batch with `recompute`, never with `auto`.
    micro_batches = sum(len(mini.micro_batches) for mini in recompute[0].plan(2, recompute[1]))
    assert (auto[6], recompute[6]) == (0, micro_batches)
    # One update: the same loss, gradients and norms.
    auto_stats, recompute_stats = TokenWeightedStats.merge([auto[3]]), TokenWeightedStats.merge([recompute[3]])
    assert auto_stats["actor/pg_loss"] == pytest.approx(recompute_stats["actor/pg_loss"], abs=1e-6)
    assert auto_stats["actor/ratio_mean"] == pytest.approx(recompute_stats["actor/ratio_mean"], abs=1e-5)
    assert auto[4] == pytest.approx(recompute[4], rel=1e-4)
    for name, grad in recompute[5].items():
        torch.testing.assert_close(auto[5][name], grad, atol=1e-6, rtol=1e-4, msg=name)
    # The sampler-actor mismatch is still measured, in the update's first mini-batch.
    assert auto_stats["rollout/logp_mismatch_abs"] < 1e-5
    assert TokenWeightedStats.merge([recompute[7]])["rollout/logp_mismatch_abs"] < 1e-5


def test_auto_recomputes_under_top_p_where_the_engine_log_probs_are_not_the_policys(monkeypatch):
    from helpers.rollout import random_policy

    step, samples, old, *_, forwards, _ = _run(random_policy(), {"top_p": 0.5}, "auto", monkeypatch)
    assert step.parts.old_logprobs == "recompute" and forwards > 0
    # The nucleus renormalises: log q >= log pi on every sampled token, strictly somewhere.
    gaps = [q - p for s, row in zip(samples, old) for q, p in zip(s.sampling_logp, row)]
    assert min(gaps) > -1e-5 and max(gaps) > 1e-2
