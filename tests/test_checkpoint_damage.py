"""Damaged checkpoints of real tiny SFT and GRPO runs: the newest intact one is resumed with a warning
naming what was wrong, a folder with none intact is refused before any process starts, and a full
disk during a save names the folder (agentrl.training.checkpoint_files).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers.grpo_runs import TINY_RUN, grpo_command, metric_records, write_arith_inputs
from helpers.sft_runs import BASE_SFT, sft_env, sft_run_args, sft_run_results, train_sft_run

from agentrl.training.checkpoint_files import (
    MANIFEST,
    CheckpointsDamaged,
    CheckpointWriteFailed,
    choose_checkpoint,
    naming_a_full_disk,
)

# 12 steps; step_4, step_8 kept. ZeRO-2 (the paper's multi-process stages write it so) keeps the
# optimizer states in files of their own, which one damage truncates; ZeRO-0 keeps them in the
# model states file.
SFT = {**BASE_SFT, "epochs": 2, "save_every_steps": 4, "keep_checkpoints": 2, "deepspeed": {"zero_stage": 2}}


@pytest.fixture(scope="module")
def reference(tiny_sft_workspace):
    """An uninterrupted run: its metrics, its final weights, its checkpoint folder."""
    metrics, weights = train_sft_run(tiny_sft_workspace, "reference", SFT)
    checkpoints = tiny_sft_workspace / "reference" / "ckpt"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_4", "step_8"]
    assert all((checkpoints / tag / MANIFEST).is_file() for tag in ("step_4", "step_8")), "sizes recorded"
    assert not list(checkpoints.glob("*.partial")), "no half-written folder left"
    return metrics, weights, checkpoints


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _model_states(tag_dir: Path) -> Path:
    (path,) = tag_dir.glob("*model_states.pt")
    return path


# name -> (how to damage the copy, the tag resumed, fragments of the warning)
DAMAGES = {
    "truncated model states": (lambda c: _truncate(_model_states(c / "step_8")), "step_4", ["model_states.pt", "truncated"]),
    "truncated optimizer states": (lambda c: _truncate(next((c / "step_8").glob("*optim_states.pt"))), "step_4", ["optim_states.pt", "truncated"]),
    "truncated trainer state": (lambda c: _truncate(c / "step_8" / "trainer_state.json"), "step_4", ["trainer_state.json"]),
    "missing RNG file": (lambda c: (c / "step_8" / "rng_rank0.pt").unlink(), "step_4", ["rng_rank0.pt is missing"]),
    "missing step folder": (lambda c: shutil.rmtree(c / "step_8"), "step_4", ["names step_8, which does not exist"]),
    "latest pointing nowhere": (lambda c: (c / "latest").write_text("step_20"), "step_8", ["names step_20, which does not exist"]),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(DAMAGES))
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(reference, tmp_path, case, caplog):
    damage, resumed, fragments = DAMAGES[case]
    checkpoints = shutil.copytree(reference[2], tmp_path / "ckpt")
    damage(checkpoints)
    with caplog.at_level(logging.WARNING):
        tag, state = choose_checkpoint(checkpoints, logging.getLogger("test"))
    assert (tag, state["step"]) == (resumed, int(resumed.removeprefix("step_")))
    warning = caplog.text
    for fragment in fragments:
        assert fragment in warning, (fragment, warning)
    assert (checkpoints / "latest").read_text() == resumed
    if resumed == "step_4" and case != "missing step folder":
        assert (checkpoints / "step_8.damaged").is_dir(), "moved aside: pruning never counts it"


@pytest.mark.slow
def test_a_truncated_newest_checkpoint_is_survived_and_the_run_ends_with_the_uninterrupted_model(
    tiny_sft_workspace, reference
):
    metrics, weights, checkpoints = reference
    run = tiny_sft_workspace / "damaged"
    shutil.copytree(checkpoints, run / "ckpt")
    _truncate(_model_states(run / "ckpt" / "step_8"))
    done = subprocess.run(
        sft_run_args(tiny_sft_workspace, "damaged", SFT, 1), env=sft_env(), capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "damaged checkpoint" in done.stderr and "truncated" in done.stderr, done.stderr[-3000:]
    resumed, resumed_weights = sft_run_results(run)
    assert [m["step"] for m in resumed] == list(range(1, 13)), "steps 5-12 trained again, none twice"
    torch.testing.assert_close(torch.tensor([m["loss"] for m in resumed]), torch.tensor([m["loss"] for m in metrics]))
    for key in weights:
        torch.testing.assert_close(resumed_weights[key], weights[key], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_folder_without_an_intact_checkpoint_is_refused_before_any_process_starts(tiny_sft_workspace, reference):
    run = tiny_sft_workspace / "all-damaged"
    shutil.copytree(reference[2], run / "ckpt")
    for tag in ("step_4", "step_8"):
        _truncate(_model_states(run / "ckpt" / tag))
    with pytest.raises(CheckpointsDamaged, match="step_4.*truncated"):
        choose_checkpoint(run / "ckpt", repair=False)
    started = time.monotonic()
    done = subprocess.run(
        sft_run_args(tiny_sft_workspace, "all-damaged", SFT, 1), env=sft_env(), capture_output=True, text=True
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "no intact checkpoint to resume" in done.stderr and "step_8" in done.stderr
    assert time.monotonic() - started < 60 and not (run / "metrics.jsonl").exists() and not (run / "model").exists()
    assert sorted(p.name for p in (run / "ckpt").glob("step_*")) == ["step_4", "step_8"], "left as they were"


def test_a_full_disk_names_the_checkpoint_folder(tmp_path):
    folder = tmp_path / "ckpt" / "step_3.partial"
    with pytest.raises(
        CheckpointWriteFailed, match=r"writing the checkpoint .*step_3.partial failed: the disk is full"
    ):
        with naming_a_full_disk(folder), open("/dev/full", "wb", buffering=0) as device:
            device.write(b"\0" * 4096)  # the kernel answers ENOSPC, as a full file system does
    with pytest.raises(OSError) as other:  # another write error is not put down to the disk
        with naming_a_full_disk(folder):
            raise OSError(errno.EACCES, "Permission denied")
    assert other.value.errno == errno.EACCES


def test_a_manifest_records_every_file_size(tmp_path):
    from agentrl.training.checkpoint_files import damage_of, write_manifest

    tag = tmp_path / "step_5"
    (tag / "sub").mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"x" * 100)
    (tag / "sub" / "more.pt").write_bytes(b"y" * 10)
    (tag / "trainer_state.json").write_text(json.dumps({"step": 5}))
    write_manifest(tag)
    assert damage_of(tag) is None
    (tag / "sub" / "more.pt").write_bytes(b"y" * 9)
    assert "more.pt has 9 bytes, 10 were written" in damage_of(tag)


GRPO = {**TINY_RUN, "grpo": {**TINY_RUN["grpo"], "max_steps": 3, "test_freq": 0, "val_before_train": False}}


def _grpo(model: Path, root: Path, run: Path) -> list[str]:
    command = grpo_command(model, root, run)
    command[command.index("--config-json") + 1] = json.dumps(GRPO)  # a checkpoint each step, 2 kept
    return command


@pytest.mark.timeout(1800)  # three short GRPO runs on a loaded 2-core machine
@pytest.mark.slow
def test_a_truncated_newest_grpo_checkpoint_is_survived_and_the_run_ends_with_the_uninterrupted_model(
    random_policy_dir, tmp_path
):
    from safetensors.torch import load_file

    root = write_arith_inputs(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    straight = tmp_path / "straight"
    subprocess.run(_grpo(random_policy_dir, root, straight), check=True, env=env, capture_output=True, timeout=900)

    damaged = tmp_path / "damaged"
    checkpoints = damaged / "checkpoints"
    process = subprocess.Popen(
        _grpo(random_policy_dir, root, damaged), env=env, start_new_session=True, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 900
    while not ((checkpoints / "latest").exists() and (checkpoints / "latest").read_text() == "step_2"):
        assert process.poll() is None, "the run ended before it was stopped after two saves"
        assert time.monotonic() < deadline, "no checkpoint of step 2 within 15 minutes"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)  # while step 3 rolls out
    process.wait()
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_1", "step_2"]
    truncated = _model_states(checkpoints / "step_2")
    _truncate(truncated)

    done = subprocess.run(_grpo(random_policy_dir, root, damaged), env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    warning = next((line for line in done.stderr.splitlines() if "damaged checkpoint" in line), "")
    assert f"step_2/{truncated.name}" in warning and "(truncated)" in warning, done.stderr[-3000:]
    assert "resuming from step_1 instead" in warning and "step 1 of 3 done" in done.stderr, done.stderr[-3000:]
    assert [r["step"] for r in metric_records(damaged / "metrics.jsonl")] == [1, 2, 3], "every step once"
    expected, resumed = (
        load_file(str(straight / "rl" / "model.safetensors")),
        load_file(str(damaged / "rl" / "model.safetensors")),
    )
    assert resumed.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
