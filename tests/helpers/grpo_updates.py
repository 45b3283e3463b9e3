"""One GRPO update on real DeepSpeed, for the tests that check it against plain torch and shared prompts."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from agentrl.config import load_config
from agentrl.grpo.metrics import TokenWeightedStats
from agentrl.grpo.policy import ResponseLogProbs
from agentrl.grpo.variants import resolve_algorithm


def uneven_samples(vocab: int, shapes, seed: int = 0) -> list:
    """Prompt groups of n samples; ``shapes[g] = (prompt length, response lengths)``. Masks with tool gaps."""
    from agentrl.grpo.batching import PolicySample

    generator = torch.Generator().manual_seed(seed)
    samples = []
    for prompt_length, response_lengths in shapes:
        prompt = torch.randint(5, vocab, (prompt_length,), generator=generator).tolist()
        for response_length in response_lengths:
            response = torch.randint(5, vocab, (response_length,), generator=generator).tolist()
            mask = (torch.rand(response_length, generator=generator) > 0.3).long().tolist()
            mask[0] = 1
            advantage = float(torch.randn(1, generator=generator))
            samples.append(PolicySample(prompt + response, prompt_length, mask, [0.0] * response_length, advantage))
    return samples


def deepspeed_update(model_dir: Path, samples, budget: int, overrides: dict, monkeypatch=None):
    """One GRPO update of ``samples`` on DeepSpeed; returns (plan, the statistics of the
    recomputation pass and the update, grad norms, params, cfg, the gradients of the first
    optimizer step as DeepSpeed is about to apply them)."""
    from agentrl.grpo import step as grpo_step
    from agentrl.grpo.step import Components, GrpoStep
    from agentrl.grpo.trainer import GrpoPaths, build_engine
    from agentrl.training import deepspeed_engine as dse
    from agentrl.training.model import load_causal_lm

    first_grads = {}
    if monkeypatch is not None:
        real_step = grpo_step.step_with_grad_norm

        def step_recording_grads(engine):
            from deepspeed.utils import safe_get_full_grad  # reads ZeRO-partitioned gradients too

            if not first_grads:
                first_grads.update(
                    {k: safe_get_full_grad(v).clone() for k, v in engine.module.model.named_parameters()}
                )
            return real_step(engine)

        monkeypatch.setattr(grpo_step, "step_with_grad_norm", step_recording_grads)

    cfg = load_config(
        {
            "grpo": {
                "n": 2,
                "batch_prompts": 2,
                "mini_batch_prompts": 2,
                "micro_batch_tokens": budget,
                "lr": 1e-3,
                **overrides,
            }
        }
    )
    ctx = dse.init_distributed()
    paths = GrpoPaths(
        model_dir,
        Path("-"),
        (),
        Path("-"),
        Path("-"),
        Path("-"),
        dse.find_deepspeed_config(cfg.grpo.deepspeed.zero_stage),
    )
    actor = ResponseLogProbs(load_causal_lm(model_dir, device=ctx.device), logit_chunk_tokens=7, temperature=1.0)
    engine = build_engine(actor, cfg, paths, ctx, torch.float32, steps=1)
    settings = resolve_algorithm(cfg.grpo)
    reference = None
    if settings.uses_reference:
        reference = ResponseLogProbs(
            load_causal_lm(model_dir, device=ctx.device).eval(), logit_chunk_tokens=7, temperature=1.0
        )
    parts = Components(cfg, settings, ctx, engine, reference, None, None, None, pad_token_id=0)
    step = GrpoStep(parts)
    samples = copy.deepcopy(samples)
    groups = len(samples) // cfg.grpo.n
    # rank r rolled out groups r, r + W, ... (grpo.rollout_queue: fixed); as GrpoStep.run
    keys = [(0, k * ctx.world_size + ctx.rank) for k in range(groups)]
    samples, minis = step.distribute(samples, keys)
    plan = step.plan(groups, samples, minis)
    recomputed = step.recompute_logprobs(samples, plan)
    stats, grad_norms, lrs = step.update(samples, plan)
    params = {k: v.detach().clone() for k, v in engine.module.model.named_parameters()}
    # the statistics of both passes, as the step's record merges them
    merged = TokenWeightedStats.merge([recomputed, stats])
    # this rank's trained prompt + response tokens, after any redistribution over the ranks
    merged["rank/input_tokens"] = sum(
        len(samples[i].input_ids) for mini in plan for mb in mini.micro_batches for i in mb
    )
    return plan, merged, grad_norms, params, cfg, first_grads
