"""``rollout.top_k: 0`` (the schema's "-1 (or 0) disables top-k") in every stage that samples.

Each stage builds its sampling settings through ``SamplingParams.from_config``; these run the
real code of GRPO's rollout step, GRPO validation and evaluation / filter scoring on a tiny
random model with the config's ``top_k: 0``, which hand-built ``SamplingParams(top_k=0)`` refused.
"""

from __future__ import annotations

import pytest
import torch
from helpers.rollout import arith_problems, random_policy
from transformers import AutoTokenizer

from agentrl.config import load_config
from agentrl.rollout import SamplingParams

CONFIG = {
    "rollout": {"top_k": 0, "max_response_tokens": 16, "max_turns": 1, "max_prompt_tokens": 512},
    "reward": {"overlong": {"max_response_length": 16, "buffer_length": 4}},
    "sandbox": {"workers": 1},
    "grpo": {"n": 2, "batch_prompts": 2, "mini_batch_prompts": 2, "validation": {"n": 2}},
}


@pytest.fixture(scope="module")
def cfg():
    return load_config(CONFIG)


def test_from_config_turns_zero_top_k_off_and_keeps_the_stage_overrides(cfg):
    params = SamplingParams.from_config(cfg.rollout, 7, temperature=0.5, top_p=0.6)
    assert (params.top_k, params.temperature, params.top_p, params.seed) == (-1, 0.5, 0.6, 7)
    assert params.max_tokens == cfg.rollout.max_response_tokens
    plain = SamplingParams.from_config(cfg.rollout)
    assert (plain.temperature, plain.top_p) == (cfg.rollout.temperature, cfg.rollout.top_p)


@pytest.fixture(scope="module")
def parts(cfg):
    """The real agent loop (hf engine on the random policy), sandbox and reward function."""
    from agentrl.rewards import RewardFunction
    from agentrl.rollout import AgentLoop, make_engine
    from agentrl.tools.code_interpreter import CodeInterpreter
    from agentrl.tools.factory import make_sandbox

    model_dir = str(random_policy())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with make_sandbox(cfg.sandbox) as sandbox:
        loop = AgentLoop(
            make_engine(cfg.rollout, model_dir), tokenizer, CodeInterpreter(sandbox, cfg.tool), cfg.rollout
        )
        yield loop, RewardFunction(cfg.reward, sandbox), tokenizer


def _single_process():
    from agentrl.training.deepspeed_engine import DistributedContext

    return DistributedContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def test_grpo_rollout_step_samples_with_top_k_zero(cfg, parts):
    from agentrl.grpo.prompts import PromptSampler
    from agentrl.grpo.step import Components, GrpoStep
    from agentrl.grpo.variants import resolve_algorithm

    loop, reward_fn, tokenizer = parts
    step = GrpoStep(
        Components(
            cfg=cfg,
            settings=resolve_algorithm(cfg.grpo),
            ctx=_single_process(),
            engine=None,  # collect() rolls out and grades; it never touches the actor
            reference=None,
            rollout_engine=loop.engine,
            loop=loop,
            reward_fn=reward_fn,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    groups, _ = step.collect(1, PromptSampler(arith_problems(4), seed=0))
    assert len(groups) == 2 and all(len(g.trajectories) == 2 for g in groups)


def test_grpo_validation_samples_with_top_k_zero(cfg, parts):
    from agentrl.grpo.validation import EvalSet, validate

    loop, reward_fn, _ = parts
    metrics = validate(cfg, loop, reward_fn, [EvalSet("arith", tuple(arith_problems(2)))], _single_process())
    assert 0.0 <= metrics["val/arith/avg@2"] <= 1.0


def test_evaluation_and_filter_scoring_sample_with_top_k_zero(cfg):
    from agentrl.sampling.rollouts import SamplingSetup, grade_problems

    setup = SamplingSetup(n=2, temperature=0.6, top_p=0.95, seed=0, seed_tag="test")
    rows: list[dict] = []
    grade_problems(
        cfg, str(random_policy()), arith_problems(2), setup, lambda _problem, problem_rows: rows.extend(problem_rows)
    )
    assert [(r["problem_id"], r["sample_index"]) for r in rows] == [
        (p.id, i) for p in arith_problems(2) for i in range(2)
    ]
