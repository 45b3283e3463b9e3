"""Preemption: a stop signal makes the running step the last, a checkpoint is written, the stage
exits with ``EXIT_CODE`` and the rerun resumes with no step repeated or skipped; the wall-time
checkpoint interval. Real signals to real stage subprocesses on the tiny embedded model."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.grpo_runs import GRPO_STEPS, TINY_RUN, arith_split, grpo_paths, metric_records_so_far, unsaved_grpo_command
from helpers.sft_runs import BASE_SFT, sft_env, sft_run_args, sft_run_results, sft_workspace, train_sft_run

from agentrl.training.preemption import (
    EXIT_CODE,
    CheckpointClock,
    StepBoundary,
    StopRequest,
    TimeLimitClock,
    job_end_time,
    stop_on_signals,
)


def test_the_time_limit_is_near_when_one_more_step_of_the_longest_length_would_end_within_the_margin():
    import torch

    now = [0.0]
    clock = TimeLimitClock(1000.0, 5.0, now=lambda: now[0])
    assert not clock.due()
    now[0] = 650.0
    clock.step_took(40.0)
    assert not clock.due()  # 650 + 40 + 300 < 1000
    clock.step_took(10.0)  # the longest step counts, not the last
    now[0] = 661.0
    assert clock.due() and "min left" in clock.reason()
    assert not TimeLimitClock(None, 5.0, now=lambda: 1e12).due()  # no time limit
    assert not TimeLimitClock(1000.0, None, now=lambda: 1e12).due()  # turned off
    boundary = StepBoundary(StopRequest(), CheckpointClock(None), torch.device("cpu"), clock)
    decision = boundary.decide(step_interval_due=False, last_step=False, step_seconds=1.0)
    assert decision.save and decision.stop and decision.reason.startswith("the SLURM job's time limit ("), decision
    assert not boundary.decide(step_interval_due=False, last_step=True).save  # the final model follows


def test_the_job_end_time_is_read_from_the_environment_else_from_squeue(tmp_path, monkeypatch):
    from helpers.fake_slurm import add_job, install, read_job, write_job

    for key, value in install(tmp_path / "bin", tmp_path / "slurm").items():
        monkeypatch.setenv(key, value)
    job = add_job(tmp_path / "slurm", state_name="RUNNING", workdir=str(tmp_path), comment="rule_sft")
    end = read_job(job, tmp_path / "slurm")["end_limit"]
    assert job_end_time({"SLURM_JOB_END_TIME": "1700000000", "SLURM_JOB_ID": job}) == 1700000000.0
    assert job_end_time({"SLURM_JOB_ID": job}) == float(int(end))  # squeue prints whole seconds, local time
    assert job_end_time({"SLURM_JOB_ID": job}, ask_squeue=False) is None
    assert job_end_time({}) is None
    write_job({**read_job(job, tmp_path / "slurm"), "end_limit": None}, tmp_path / "slurm")
    assert job_end_time({"SLURM_JOB_ID": job}) is None  # N/A: no limit


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_the_first_signal_requests_a_stop_the_second_takes_the_default_action_and_handlers_come_back(signum):
    before = signal.getsignal(signum)
    with stop_on_signals() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signum)
        time.sleep(0.01)  # Python runs handlers between bytecodes of the main thread
        assert stop.requested and stop.reason == signal.Signals(signum).name
        assert signal.getsignal(signum) is signal.SIG_DFL
    assert signal.getsignal(signum) is before


def test_the_wall_time_clock_is_due_after_its_minutes_and_resets_on_a_save():
    now = [0.0]
    clock = CheckpointClock(2.0, now=lambda: now[0])
    assert not clock.due()
    now[0] = 119.0
    assert not clock.due()
    now[0] = 120.0
    assert clock.due()
    clock.reset()
    assert not clock.due()
    assert not CheckpointClock(None, now=lambda: now[0] + 1e9).due()


def test_a_boundary_saves_on_any_reason_and_stops_only_before_the_last_step():
    import torch

    stop, now = StopRequest(), [0.0]
    boundary = StepBoundary(stop, CheckpointClock(1.0, now=lambda: now[0]), torch.device("cpu"))
    assert boundary.decide(step_interval_due=False, last_step=False).save is False
    assert boundary.decide(step_interval_due=True, last_step=False).reason == "step interval"
    now[0] = 60.0
    assert boundary.decide(step_interval_due=False, last_step=False).reason == "wall-time interval"
    assert boundary.decide(step_interval_due=False, last_step=True).save is False  # the final model follows
    stop.request("SIGTERM")
    decision = boundary.decide(step_interval_due=False, last_step=False)
    assert decision.save and decision.stop and decision.reason == "SIGTERM"
    assert not boundary.decide(step_interval_due=False, last_step=True).stop


# --------------------------------------------------------------------------- GRPO
def _signal_after(process: subprocess.Popen, metrics: Path, step: int, signum: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not any(r["step"] >= step for r in metric_records_so_far(metrics)):
        assert process.poll() is None, "the run ended before the signal"
        assert time.monotonic() < deadline, f"step {step} not reached in {timeout} s"
        time.sleep(0.005)
    process.send_signal(signum)


@pytest.fixture(scope="module")
def grpo_inputs(tmp_path_factory):
    from helpers.rollout import random_policy

    from agentrl.data.records import write_records

    root = tmp_path_factory.mktemp("preempt-inputs")
    write_records(arith_split(9, "rl"), root / "rl_train.parquet")
    write_records(arith_split(3, "eval"), root / "arith.parquet")
    return random_policy(), root


@pytest.mark.timeout(1800)  # several training runs: over the global 600 s on a loaded 2-core machine
@pytest.mark.slow
# long: SIGTERM repeats the SIGUSR1 run through the same handler (the fast test above sends both)
@pytest.mark.parametrize("signum", [signal.SIGUSR1, pytest.param(signal.SIGTERM, marks=pytest.mark.long)])
def test_a_stop_signal_checkpoints_the_running_step_exits_and_the_rerun_resumes(grpo_inputs, tmp_path, signum):
    model, root = grpo_inputs
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    straight = tmp_path / "straight"
    subprocess.run(unsaved_grpo_command(model, root, straight), check=True, env=env, capture_output=True, timeout=600)

    run = tmp_path / "stopped"
    process = subprocess.Popen(
        unsaved_grpo_command(model, root, run), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    _signal_after(process, run / "metrics.jsonl", 1, signum)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == EXIT_CODE, stderr[-3000:]
    stopped_at = metric_records_so_far(run / "metrics.jsonl")[-1]["step"]
    assert 1 <= stopped_at < GRPO_STEPS
    name = signal.Signals(signum).name
    assert f"stopped on {name} after step {stopped_at}" in stderr and "resumes from it" in stderr, stderr[-3000:]
    # save_freq 0: the only checkpoint is the one the stop wrote, of the step that was running
    assert (run / "checkpoints" / "latest").read_text() == f"step_{stopped_at}"
    assert not (run / "rl" / "config.json").exists()

    done = subprocess.run(unsaved_grpo_command(model, root, run), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"step {stopped_at} of {GRPO_STEPS} done" in done.stderr
    a, b = metric_records_so_far(straight / "metrics.jsonl"), metric_records_so_far(run / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(GRPO_STEPS + 1)), "no step repeated or skipped"
    for ra, rb in zip(a, b):  # the same prompts, rollouts and updates as the uninterrupted run
        for key in ra:
            if key.startswith(("rollout/", "actor/", "val/")) and not key.endswith("_s"):
                assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-7), (ra["step"], key)


@pytest.mark.timeout(1800)  # several training runs: over the global 600 s on a loaded 2-core machine
def test_the_wall_time_interval_checkpoints_without_a_step_interval(grpo_inputs, tmp_path):
    from agentrl.config import load_config
    from agentrl.grpo.trainer import train

    model, root = grpo_inputs
    overlay = {"max_steps": 3, "save_freq": 0, "save_every_minutes": 1e-6, "keep_checkpoints": None}
    cfg = load_config({**TINY_RUN, "grpo": {**TINY_RUN["grpo"], **overlay, "test_freq": 0}})
    paths = grpo_paths(model, root, tmp_path)
    assert train(cfg, paths) == 3
    # due after every step but the last (the final model is written then)
    assert sorted(p.name for p in paths.checkpoints.glob("step_*")) == ["step_1", "step_2"]


# --------------------------------------------------------------------------- SFT
@pytest.mark.timeout(1800)  # several training runs: over the global 600 s on a loaded 2-core machine
@pytest.mark.slow
def test_sft_stops_on_sigusr1_with_a_checkpoint_and_the_rerun_ends_as_an_uninterrupted_run(tmp_path_factory):
    import torch

    root = sft_workspace(tmp_path_factory.mktemp("sft-preempt"))
    sft = {**BASE_SFT, "epochs": 4}  # 24 steps, no step interval
    reference, reference_weights = train_sft_run(root, "straight", sft)
    process = subprocess.Popen(
        sft_run_args(root, "stopped", sft, 1),
        env=sft_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _signal_after(process, root / "stopped" / "metrics.jsonl", 3, signal.SIGUSR1)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == EXIT_CODE, stderr[-3000:]
    stopped_at = metric_records_so_far(root / "stopped" / "metrics.jsonl")[-1]["step"]
    assert 3 <= stopped_at < 24 and f"stopped on SIGUSR1 after step {stopped_at}" in stderr
    resumed_run = subprocess.run(
        sft_run_args(root, "stopped", sft, 1), env=sft_env(), capture_output=True, text=True, timeout=900
    )
    assert resumed_run.returncode == 0, resumed_run.stderr[-3000:]
    resumed, weights = sft_run_results(root / "stopped")
    assert [m["step"] for m in resumed] == list(range(1, 25)), "no step repeated or skipped"
    torch.testing.assert_close(
        torch.tensor([m["loss"] for m in resumed]), torch.tensor([m["loss"] for m in reference]), rtol=1e-5, atol=1e-6
    )
    for key in reference_weights:
        torch.testing.assert_close(weights[key], reference_weights[key], rtol=1e-5, atol=1e-6)
