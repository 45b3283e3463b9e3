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
from helpers.grpo_runs import TINY_RUN, grpo_command, metric_records, rollout_process_under, write_arith_inputs

from agentrl.config import check_cross_keys, load_config
from agentrl.errors import StageInterrupted


@pytest.mark.timeout(900)
@pytest.mark.parametrize("engines", [1, 2])
def test_one_step_off_rollouts_come_from_the_version_they_record_and_a_dead_process_stops_the_wait(tmp_path, engines):
    """max_staleness 1: step 2 is rolled out while step 1 "trains", with version 0; step 3 with
    version 1. Each trajectory's sampling log-probs equal its recorded version's weights' own and
    not the other version's; killing the process makes the next wait fail in seconds, naming it.
    With two rollout engines (grpo.rollout_engines) they share the prompts, every push reaches
    both (ranks 1 and 2 of the transfer group) and the trainer gets every group once."""
    from helpers.rollout import random_policy
    from helpers.rollout_process import check_sampled_by_recorded_version, one_step_off, two_versions

    from agentrl.grpo.rollout_process import RolloutProcessError

    model_dir = random_policy()
    root = write_arith_inputs(tmp_path)
    cfg = load_config({**TINY_RUN, "grpo": {**TINY_RUN["grpo"], "max_staleness": 1, "rollout_engines": engines}})
    check_cross_keys(cfg)
    versions = two_versions(model_dir)
    with one_step_off(cfg, model_dir, root / "rl_train.parquet", versions) as (process, results):
        assert [r.policy_version for r in results] == [0, 0, 1]
        assert [r.timing["rollout/staleness"] for r in results] == [0.0, 1.0, 1.0]
        assert results[0].sampler_state != results[1].sampler_state != results[2].sampler_state
        checked = check_sampled_by_recorded_version(results, versions, atol=2e-4, gap=0.05)
        assert checked == 3 * cfg.grpo.batch_prompts * cfg.grpo.n
        for result in results:  # the step's groups, each once, whichever engine rolled it out
            assert [g.key for g in result.groups] == sorted({g.key for g in result.groups})
            assert len(result.groups) == cfg.grpo.batch_prompts
        assert len(process.children) == engines

        os.kill(process.children[-1].process.pid, signal.SIGKILL)
        began = time.monotonic()
        with pytest.raises(RolloutProcessError, match="was killed by signal 9") as failure:
            process.validate()
        assert time.monotonic() - began < 10
        assert isinstance(failure.value, StageInterrupted) and "resumes from the last checkpoint" in str(failure.value)


def test_staleness_needs_its_own_process_and_the_proximal_log_probs():
    """Stale rollouts need the separate placement and the proximal log-probs; its rollout process
    runs either engine (vLLM tensor parallel over its GPUs, from grpo.rollout_share, not the TP key);
    ZeRO-3 only there (its pushes gather each parameter once)."""
    from agentrl.config import ConfigError, rollout_placement

    assert rollout_placement(load_config({}).grpo) == "colocated"
    assert rollout_placement(load_config({"grpo": {"max_staleness": 1}}).grpo) == "separate"
    for engine in ("hf", "vllm"):
        check_cross_keys(load_config({"grpo": {"max_staleness": 1}, "rollout": {"engine": engine}}))
    check_cross_keys(load_config({"grpo": {"max_staleness": 1, "deepspeed": {"zero_stage": 3}}}))
    tp2 = {"engine": "vllm", "vllm": {"tensor_parallel_size": 2}}
    for raw, words in (
        ({"grpo": {"max_staleness": 1, "placement": "colocated"}}, "grpo.placement: colocated"),
        ({"grpo": {"max_staleness": 1, "old_logprobs": "engine"}}, "grpo.old_logprobs: engine"),
        ({"grpo": {"placement": "separate"}, "rollout": tp2}, "tensor_parallel_size = 2 with grpo.placement: separate"),
        ({"grpo": {"deepspeed": {"zero_stage": 3}}}, "zero_stage = 3 with grpo.placement: colocated"),
    ):
        with pytest.raises(ConfigError, match=words):
            check_cross_keys(load_config(raw))


def test_the_gpu_split_gives_the_rollout_engine_its_share_of_the_node():
    """grpo.rollout_share of a node's GPUs serve the rollout engines (its last ones), at least one
    each; the trainer's --nproc becomes the rest, and a trainer started on another count, a vLLM
    engine sharing one GPU, or the split on a CPU job are refused or left alone. The rollout GPUs
    hold one engine each unless grpo.rollout_engines asks for fewer, tensor parallel."""
    from agentrl.config import ConfigError, gpu_split, trainer_processes
    from agentrl.grpo.cli import trainer_nproc
    from agentrl.grpo.rollout_process import engine_layout, rollout_gpus
    from agentrl.training.deepspeed_engine import DistributedContext

    assert [gpu_split(n, 0.5) for n in (1, 2, 3, 8)] == [(1, 1), (1, 1), (1, 2), (4, 4)]
    assert [gpu_split(8, share) for share in (0.01, 0.25, 0.99)] == [(7, 1), (6, 2), (1, 7)]
    separate = load_config({"grpo": {"max_staleness": 1, "rollout_share": 0.25}})
    assert [trainer_processes(separate.grpo, n) for n in (0, 1, 8)] == [0, 1, 6]
    assert trainer_processes(load_config({}).grpo, 8) == 8  # colocated: every GPU trains
    if not torch.cuda.is_available():
        assert trainer_nproc(separate, "8") == "8"  # --nproc counts CPU processes here

    def ranks(world: int) -> DistributedContext:
        return DistributedContext(rank=0, world_size=world, local_rank=0, device=torch.device("cuda"))

    env = {"CUDA_VISIBLE_DEVICES": "3,4,5,6,7,0,1,2"}
    assert rollout_gpus(separate, ranks(6), env) == ["1", "2"]
    with pytest.raises(ConfigError, match="leaves 6 to the trainer, but 8 trainer process"):
        rollout_gpus(separate, ranks(8), env)
    assert rollout_gpus(separate, ranks(1), {"CUDA_VISIBLE_DEVICES": "5"}) == ["5"]  # hf: shared
    vllm = load_config({"grpo": {"max_staleness": 1}, "rollout": {"engine": "vllm"}})
    with pytest.raises(ConfigError, match="NCCL there, which connects no two processes on one device"):
        rollout_gpus(vllm, ranks(1), {"CUDA_VISIBLE_DEVICES": "5"})

    # the engines on the rollout GPUs: one each by default (data parallel), or tensor parallel shares
    gpus = ["4", "5", "6", "7"]
    assert engine_layout(vllm, gpus) == [["4"], ["5"], ["6"], ["7"]]
    two = load_config({"grpo": {"max_staleness": 1, "rollout_engines": 2}, "rollout": {"engine": "vllm"}})
    assert engine_layout(two, gpus) == [["4", "5"], ["6", "7"]]
    assert engine_layout(separate, None) == [None]  # CPU: one engine
    with pytest.raises(ConfigError, match="rollout_engines = 3 does not divide the 4 rollout GPUs"):
        engine_layout(load_config({"grpo": {"max_staleness": 1, "rollout_engines": 3}}), gpus)
    with pytest.raises(ConfigError, match="rollout_engines = 2 with rollout.engine: vllm on CPU"):
        engine_layout(two, None)


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
        # mini-batches of both prompts: two trainer ranks (the last run) update on one prompt each
        run = {
            **TINY_RUN,
            "grpo": {**TINY_RUN["grpo"], "test_freq": 0, "max_steps": 20, "mini_batch_prompts": 2, **grpo},
        }
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
    victim = rollout_process_under(stage.pid)
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

    # Two trainer ranks under ZeRO-3 beside two rollout engines sharing the prompts: rank 0 takes
    # every group, the update's redistribution gives rank 1 its share, and each push gathers every
    # parameter on both ranks and reaches both engines; the rollouts are still the colocated run's
    # and the weights its to round-off.
    ranks = tmp_path / "separate-2ranks"
    line = command(ranks, placement="separate", rollout_engines=2, deepspeed={"zero_stage": 3})
    line[line.index("--nproc") + 1] = "2"
    subprocess.run(line, check=True, env=env, capture_output=True, timeout=600)
    for a, b in zip(colocated, metric_records(ranks / "metrics.jsonl"), strict=True):
        for key, value in a.items():
            if key.startswith("rollout/") and "logp_mismatch" not in key:
                assert b[key] == value, (a["step"], key)
    three = load_file(str(ranks / "rl" / "model.safetensors"))
    for name in one:
        torch.testing.assert_close(three[name], one[name], rtol=1e-4, atol=1e-4, msg=name)
    # the last checkpoint's model folder is the final model, gathered from both ranks' partitions
    saved = load_file(str(ranks / "checkpoints" / "step_20" / "model.safetensors"))
    assert saved.keys() == three.keys()
    for name, tensor in three.items():
        torch.testing.assert_close(saved[name], tensor, rtol=0, atol=0, msg=name)
