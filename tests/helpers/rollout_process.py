"""Driving a GRPO rollout process (agentrl.grpo.rollout_process) one step off, as the trainer does,
and checking that each answer's trajectories were sampled by the policy version it records."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch


def two_versions(model_dir: Path) -> list:
    """Version 0 (the model folder's weights, float32) and version 1, perturbed far enough from it
    that their log-probs tell them apart."""
    from transformers import AutoModelForCausalLM

    versions = [AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval() for _ in range(2)]
    with torch.no_grad():
        for p in versions[1].parameters():
            p.add_(0.5 * torch.randn_like(p))
    return versions


@contextmanager
def one_step_off(cfg, model_dir: Path, train: Path, versions: list):
    """A rollout process with ``grpo.max_staleness`` 1 driven for three steps as the trainer drives
    it (rollouts(k), train k, publish(k)); yields the process, still running, and the three answers."""
    import copy

    from agentrl.grpo.prompts import PromptSampler
    from agentrl.grpo.rollout_process import RolloutProcess, TrainerWeights
    from agentrl.rewards.ground_truth import read_gradable_problems
    from agentrl.training.deepspeed_engine import DistributedContext
    from agentrl.training.seeds import derived_seed

    sampler = PromptSampler(read_gradable_problems(train), derived_seed(cfg.seed, "grpo-data"))
    trainer = copy.deepcopy(versions[0])  # the trainer's module: each "update" loads a version into it
    ctx = DistributedContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    process = RolloutProcess(cfg, model_dir, train, [], TrainerWeights(trainer), ctx, threads=1, total_steps=3)
    try:
        process.begin(0, sampler.state_dict())
        first = process.rollouts(1)  # asks for step 2 at once, before "training" step 1
        trainer.load_state_dict(versions[1].state_dict())
        process.publish(1)  # sent once the rollout process ended step 2
        second = process.rollouts(2)  # asks for step 3, rolled out with version 1
        trainer.load_state_dict(versions[0].state_dict())
        process.publish(2)
        third = process.rollouts(3)
        yield process, (first, second, third)
    finally:
        process.close()


def response_logprobs(model, trajectory) -> torch.Tensor:
    """log pi(response token) under ``model`` at temperature 1, for every response position."""
    ids = torch.tensor([list(trajectory.prompt_ids) + list(trajectory.response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(trajectory.prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(trajectory.prompt_ids) :, None])[:, 0]


def check_sampled_by_recorded_version(results, versions: list, atol: float, gap: float) -> int:
    """Every trajectory's sampling log-probs equal its recorded version's (to ``atol``) and differ
    from the other version's by more than ``gap``; returns how many trajectories were checked."""
    checked = 0
    for result in results:
        held, other = versions[result.policy_version], versions[1 - result.policy_version]
        for group in result.groups:
            for trajectory in group.trajectories:
                mask = torch.tensor(trajectory.loss_mask, dtype=torch.bool)
                sampled = torch.tensor(trajectory.logprobs)[mask]
                assert sampled.numel() > 0, f"step {result.step}: a trajectory without sampled tokens"
                torch.testing.assert_close(sampled, response_logprobs(held, trajectory)[mask], atol=atol, rtol=0)
                distance = (sampled - response_logprobs(other, trajectory)[mask]).abs().max()
                assert distance > gap, f"step {result.step}: version {result.policy_version} or the other?"
                checked += 1
    return checked
