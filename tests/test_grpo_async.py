"""GRPO with its rollouts in a process of their own (grpo.placement: separate, agentrl.grpo.rollout_process):
the versions a rollout process answers with are the weights it held (its sampling log-probs are
those weights' log-probs), one-step-off never exceeds its bound, a dead rollout process stops the
trainer within seconds, and the separate placement at staleness 0 trains as the colocated step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers.grpo_runs import TINY_RUN, grpo_command, metric_records, write_arith_inputs

from agentrl.config import check_cross_keys, load_config
from agentrl.errors import StageInterrupted


def _response_logprobs(model, trajectory) -> torch.Tensor:
    """log pi(response token) under ``model`` at temperature 1, for every response position."""
    ids = torch.tensor([list(trajectory.prompt_ids) + list(trajectory.response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(trajectory.prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(trajectory.prompt_ids) :, None])[:, 0]


def _sampled(trajectory) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.tensor(trajectory.loss_mask, dtype=torch.bool)
    return torch.tensor(trajectory.logprobs)[mask], mask


@pytest.mark.timeout(900)
def test_one_step_off_rollouts_come_from_the_version_they_record_and_a_dead_process_stops_the_wait(tmp_path):
    """max_staleness 1: step 2 is rolled out while step 1 "trains", with version 0; step 3 with
    version 1. Each trajectory's sampling log-probs equal its recorded version's weights' own and
    not the other version's; killing the process makes the next wait fail in seconds, naming it."""
    from helpers.rollout import random_policy
    from transformers import AutoModelForCausalLM

    from agentrl.grpo.prompts import PromptSampler
    from agentrl.grpo.rollout_process import RolloutProcess, RolloutProcessError
    from agentrl.rewards.ground_truth import read_gradable_problems
    from agentrl.training.seeds import derived_seed

    model_dir = random_policy()
    root = write_arith_inputs(tmp_path)
    raw = {**TINY_RUN, "grpo": {**TINY_RUN["grpo"], "max_staleness": 1}}
    cfg = load_config(raw)
    check_cross_keys(cfg)
    versions = [AutoModelForCausalLM.from_pretrained(model_dir).float().eval() for _ in range(2)]
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
        assert [first.policy_version, second.policy_version, third.policy_version] == [0, 0, 1]
        assert [r.timing["rollout/staleness"] for r in (first, second, third)] == [0.0, 1.0, 1.0]
        assert first.sampler_state != second.sampler_state != third.sampler_state
        for result in (second, third):
            held, other = versions[result.policy_version], versions[1 - result.policy_version]
            for group in result.groups:
                for trajectory in group.trajectories:
                    sampled, mask = _sampled(trajectory)
                    torch.testing.assert_close(sampled, _response_logprobs(held, trajectory)[mask], atol=2e-4, rtol=0)
                    assert (sampled - _response_logprobs(other, trajectory)[mask]).abs().max() > 0.05

        os.kill(process.process.pid, signal.SIGKILL)
        began = time.monotonic()
        with pytest.raises(RolloutProcessError, match="was killed by signal 9") as failure:
            process.validate()
        assert time.monotonic() - began < 10
        assert isinstance(failure.value, StageInterrupted) and "resumes from the last checkpoint" in str(failure.value)
    finally:
        process.close()


def test_staleness_needs_its_own_process_and_the_proximal_log_probs():
    """Stale rollouts need the separate placement and the proximal log-probs; its rollout process
    runs either engine (vLLM with one in-process worker: tensor parallelism is refused)."""
    from agentrl.config import ConfigError, rollout_placement

    assert rollout_placement(load_config({}).grpo) == "colocated"
    assert rollout_placement(load_config({"grpo": {"max_staleness": 1}}).grpo) == "separate"
    for engine in ("hf", "vllm"):
        check_cross_keys(load_config({"grpo": {"max_staleness": 1}, "rollout": {"engine": engine}}))
    tp2 = {"engine": "vllm", "vllm": {"tensor_parallel_size": 2}}
    for raw, words in (
        ({"grpo": {"max_staleness": 1, "placement": "colocated"}}, "grpo.placement: colocated"),
        ({"grpo": {"max_staleness": 1, "old_logprobs": "engine"}}, "grpo.old_logprobs: engine"),
        ({"grpo": {"placement": "separate"}, "rollout": tp2}, "tensor_parallel_size = 2 with grpo.placement: separate"),
    ):
        with pytest.raises(ConfigError, match=words):
            check_cross_keys(load_config(raw))


def _separate_run_process(root: Path) -> int | None:
    """The pid of the rollout process under the GRPO stage started as process group ``root``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[2]) == root and b"spawn_main" in cmdline:
                return int(entry.name)
    return None


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_separate_placement_trains_as_colocated_and_a_killed_rollout_process_resumes(tmp_path):
    """The same tiny run colocated, and separate at staleness 0 with its rollout process killed
    (SIGKILL) after step 2's checkpoint: the stage stops in seconds with one line naming the
    rollout process, the rerun resumes from step 2, and the run ends with the colocated run's
    rollouts, rewards and (to round-off) weights."""
    from helpers.rollout import trained_policy
    from safetensors.torch import load_file

    model = trained_policy()
    root = write_arith_inputs(tmp_path / "inputs")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def command(folder: Path, **grpo) -> list[str]:
        line = grpo_command(model, root, folder)
        # 20 steps of ~0.1 s: the kill after step 2 lands while the run still has most of them to go
        run = {**TINY_RUN, "grpo": {**TINY_RUN["grpo"], "test_freq": 0, "max_steps": 20, **grpo}}
        line[line.index("--config-json") + 1] = json.dumps(run)
        line[line.index("--threads") + 1] = "2"
        return line

    subprocess.run(command(tmp_path / "colocated"), check=True, env=env, capture_output=True, timeout=600)
    separate = tmp_path / "separate"
    log = (tmp_path / "separate.log").open("w+")
    stage = subprocess.Popen(
        command(separate, placement="separate"), env=env, start_new_session=True, stdout=log, stderr=log
    )
    deadline = time.monotonic() + 600
    pointer = separate / "checkpoints" / "latest"
    while not (pointer.exists() and pointer.read_text() == "step_2"):
        assert stage.poll() is None, (tmp_path / "separate.log").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    victim = _separate_run_process(stage.pid)
    assert victim is not None, "no rollout process under the stage"
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    stage.wait(timeout=120)
    message = (tmp_path / "separate.log").read_text()
    assert stage.returncode == 1 and time.monotonic() - killed_at < 30, message[-3000:]
    assert f"the rollout process (pid {victim}) was killed by signal 9" in message, message[-3000:]
    assert "Traceback" not in message, message[-3000:]
    assert pointer.read_text() == "step_2" and not (separate / "rl" / "config.json").exists()

    subprocess.run(command(separate, placement="separate"), check=True, env=env, capture_output=True, timeout=600)
    colocated, resumed = (metric_records(tmp_path / name / "metrics.jsonl") for name in ("colocated", "separate"))
    assert [r["step"] for r in resumed] == [r["step"] for r in colocated]
    assert any(r.get("rollout/reward_std", 0.0) > 0 for r in colocated), "no group taught anything: nothing to compare"
    for a, b in zip(colocated, resumed):
        for key, value in a.items():
            if key.startswith("rollout/") and "logp_mismatch" not in key:
                assert b[key] == value, (a["step"], key)
            elif key.startswith("actor/"):
                assert b[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (a["step"], key)
        assert b.get("rollout/staleness", 0.0) == 0.0
    one, two = (load_file(str(tmp_path / name / "rl" / "model.safetensors")) for name in ("colocated", "separate"))
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5, msg=name)
