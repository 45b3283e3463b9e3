"""Concurrent GPU jobs get devices of their own (agentrl.devices), with no GPU: the ids are fake."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.devices import DeviceError, claim, device_pool, lock_dir, try_claim

ROOT = Path(__file__).resolve().parents[1]

# Two jobs with gpu=1 each; each records what it was given, then waits until the other has
# started too, so they provably ran at the same time (sequential jobs would time out).
SNAKEFILE = textwrap.dedent(
    """
    rule all:
        input: expand("got/{job}.txt", job=["a", "b"])

    rule record:
        output: "got/{job}.txt"
        resources: gpu=1
        shell:
            "python -m agentrl.devices --gpus {resources.gpu} -- "
            "sh -c 'echo $CUDA_VISIBLE_DEVICES > started_{wildcards.job}; "
            "for i in $(seq 200); do [ $(ls started_* | wc -l) -eq 2 ] && break; sleep 0.1; done; "
            "[ $(ls started_* | wc -l) -eq 2 ] && cp started_{wildcards.job} {output}'"
    """
)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "AGENTRL_GPUS", "SLURM_JOB_ID")}
    env.update(
        PYTHONPATH=f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}", AGENTRL_GPU_LOCK_DIR=str(tmp_path / "locks")
    )
    env.update(extra)
    return env


def test_two_concurrent_one_gpu_jobs_get_different_devices(tmp_path):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    done = subprocess.run(
        ["snakemake", "--cores", "2", "--resources", "gpu=2", "--quiet", "all"],
        cwd=tmp_path,
        env=_env(tmp_path, AGENTRL_GPUS="0,1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    got = sorted((tmp_path / "got" / f"{job}.txt").read_text().strip() for job in ("a", "b"))
    assert got == ["0", "1"]


def test_a_claim_holds_until_released_and_is_all_or_nothing(tmp_path):
    folder = tmp_path / "locks"
    first = try_claim(2, ["3", "5", "7"], folder)
    assert first is not None and first[0] == ["3", "5"]
    assert try_claim(2, ["3", "5", "7"], folder) is None  # only 7 is free: nothing is taken
    second = try_claim(1, ["3", "5", "7"], folder)
    assert second is not None and second[0] == ["7"]
    for fd in first[1]:
        os.close(fd)  # the job ended: its devices are free again
    third = try_claim(2, ["3", "5", "7"], folder)
    assert third is not None and third[0] == ["3", "5"]


def test_the_claim_outlives_exec_and_ends_with_the_command(tmp_path):
    env = _env(tmp_path, AGENTRL_GPUS="0")
    holder = subprocess.Popen(
        [sys.executable, "-m", "agentrl.devices", "--gpus", "1", "--", "sleep", "30"], env=env, stderr=subprocess.PIPE
    )
    try:
        assert b"CUDA_VISIBLE_DEVICES=0" in holder.stderr.readline()
        with pytest.raises(DeviceError, match="free"):
            claim(1, env, wait=False)
    finally:
        holder.kill()
        holder.wait()
    ids, fds = claim(1, env, wait=False)
    assert ids == ["0"]
    for fd in fds:
        os.close(fd)


def test_zero_gpus_runs_the_command_unchanged(tmp_path):
    env = _env(tmp_path, CUDA_VISIBLE_DEVICES="4")
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.devices", "--gpus", "0", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "4"


def test_asking_for_more_than_the_pool_is_a_clear_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "agentrl.devices", "--gpus", "3", "--", "true"],
        env=_env(tmp_path, AGENTRL_GPUS="0,1"),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "3 GPU(s) asked for, but this machine's pool has 2" in done.stderr


def test_pool_and_lock_folder_follow_the_environment():
    assert device_pool({"AGENTRL_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0"}) == ["2", "3"]
    assert device_pool({"CUDA_VISIBLE_DEVICES": "0,1,2"}) == ["0", "1", "2"]
    assert device_pool({"CUDA_VISIBLE_DEVICES": ""}) == []
    # inside a SLURM job the devices are numbered per job: a lock folder of its own
    assert lock_dir({"SLURM_JOB_ID": "42"}).name.endswith("-slurm42")
    assert lock_dir({"AGENTRL_GPU_LOCK_DIR": "/x/y"}) == Path("/x/y")
