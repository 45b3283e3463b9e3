"""One-step-off GRPO (``grpo.max_staleness`` 1, a rollout process) resumes exactly.

Step k + 1's rollouts are made by version k - 1 while step k trains. The checkpoint of step k
keeps them (``rollouts_ahead.pkl``), so a run killed after it (the whole process group, or the
rollout process alone) and rerun with the same command trains on the rollouts the uninterrupted
run trained on, and ends with its metrics and weights.
"""

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

STEPS = 6


def _command(model: Path, root: Path, run: Path) -> list[str]:
    line = grpo_command(model, root, run)
    config = {
        **TINY_RUN,
        "grpo": {**TINY_RUN["grpo"], "max_steps": STEPS, "test_freq": 0, "max_staleness": 1, "placement": "separate"},
    }
    line[line.index("--config-json") + 1] = json.dumps(config)
    line[line.index("--threads") + 1] = "2"
    return line


def _latest_step(checkpoints: Path) -> int:
    pointer = checkpoints / "latest"
    return int(pointer.read_text().removeprefix("step_")) if pointer.exists() else 0


def _start_until_checkpoint(command: list[str], run: Path, step: int, env: dict) -> subprocess.Popen:
    run.mkdir(parents=True, exist_ok=True)
    log = (run / "stage.log").open("w")
    process = subprocess.Popen(command, env=env, start_new_session=True, stdout=log, stderr=log)
    deadline = time.monotonic() + 600
    while _latest_step(run / "checkpoints") < step:
        assert process.poll() is None, (run / "stage.log").read_text()[-3000:]
        assert time.monotonic() < deadline, f"no checkpoint of step {step} within 10 minutes"
        time.sleep(0.02)
    return process


def _assert_same_run(straight: Path, resumed: Path) -> None:
    from safetensors.torch import load_file

    a, b = metric_records(straight / "metrics.jsonl"), metric_records(resumed / "metrics.jsonl")
    assert [r["step"] for r in b] == [r["step"] for r in a]
    assert [r.get("rollout/staleness") for r in b] == [r.get("rollout/staleness") for r in a]
    for ra, rb in zip(a, b):  # the same prompts, rollouts, rewards and updates, step for step
        for key in ra:
            if key.startswith(("rollout/", "actor/")) and not key.endswith("_s"):
                assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-7), (ra["step"], key)
    wa, wb = (load_file(str(run / "rl" / "model.safetensors")) for run in (straight, resumed))
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_one_step_off_grpo_killed_after_a_checkpoint_ends_as_the_uninterrupted_run(tmp_path):
    from helpers.rollout import random_policy

    model, root = random_policy(), write_arith_inputs(tmp_path / "inputs")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    straight = tmp_path / "straight"
    subprocess.run(_command(model, root, straight), check=True, env=env, capture_output=True, timeout=900)
    records = metric_records(straight / "metrics.jsonl")
    assert [r.get("rollout/staleness") for r in records[1:]] == [0.0] + [1.0] * (STEPS - 1)
    assert (straight / "checkpoints" / f"step_{STEPS - 1}" / "rollouts_ahead.pkl").exists()
    assert not (straight / "checkpoints" / f"step_{STEPS}" / "rollouts_ahead.pkl").exists(), "nothing after the end"

    # the whole process group killed while step 3 trains (step 4's rollouts in flight)
    group = tmp_path / "group"
    stage = _start_until_checkpoint(_command(model, root, group), group, 2, env)
    os.killpg(stage.pid, signal.SIGKILL)
    stage.wait()
    subprocess.run(_command(model, root, group), check=True, env=env, capture_output=True, timeout=900)
    _assert_same_run(straight, group)

    # the rollout process alone killed after step 4's checkpoint: the stage stops, the rerun resumes
    alone = tmp_path / "alone"
    stage = _start_until_checkpoint(_command(model, root, alone), alone, 4, env)
    victim = rollout_process_under(stage.pid)
    assert victim is not None, "no rollout process under the stage"
    os.kill(victim, signal.SIGKILL)
    assert stage.wait(timeout=120) == 1, (alone / "stage.log").read_text()[-3000:]
    subprocess.run(_command(model, root, alone), check=True, env=env, capture_output=True, timeout=900)
    _assert_same_run(straight, alone)
