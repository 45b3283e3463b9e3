"""The folder and shard locks on cluster file systems, and what a refusal says about the holder.

A file system that refuses ``flock`` is simulated by the errno Lustre mounted ``noflock`` returns
(the one part not real here: this machine has no such mount); the mounts that lock on one node
only are read from /proc/mounts text as Lustre and NFS write it. The holders are real processes.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.errors import UserInputError
from agentrl.training import folder_lock
from agentrl.training.folder_lock import (
    LOCK_FILE,
    CheckpointFolderInUse,
    LocksUnsupported,
    ShardFileInUse,
    hold_checkpoint_folder,
    hold_shard_file,
    lock_file,
    mount_of,
)

HOLD = textwrap.dedent(
    """
    import sys, time
    from agentrl.training.folder_lock import hold_checkpoint_folder
    with hold_checkpoint_folder(sys.argv[1], "grpo"):
        print("held", flush=True)
        time.sleep(600)
    """
)
MOUNTS = "\n".join(
    [
        "/dev/sda1 / ext4 rw,relatime 0 0",
        "10.0.0.1@o2ib:/scratch /scratch lustre rw,localflock,lazystatfs 0 0",
        "10.0.0.1@o2ib:/project /project lustre rw,flock,lazystatfs 0 0",
        "nas:/home /home nfs4 rw,vers=4.2,local_lock=none 0 0",
        "nas:/old /old\\040space nfs rw,vers=3,nolock 0 0",
    ]
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), **extra}


def _refusing_flock(code: int):
    real = fcntl.flock

    def flock(fd, operation):
        if operation & fcntl.LOCK_EX:
            raise OSError(code, os.strerror(code))
        return real(fd, operation)

    return flock


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL])
def test_a_file_system_that_refuses_flock_is_a_user_error_naming_the_mount_and_the_fix(tmp_path, monkeypatch, code):
    monkeypatch.delenv("AGENTRL_LOCK_DIR", raising=False)
    monkeypatch.setattr(folder_lock.fcntl, "flock", _refusing_flock(code))
    point, fstype, _ = mount_of(tmp_path.resolve(), Path("/proc/mounts").read_text())
    for hold in (
        lambda: hold_checkpoint_folder(tmp_path / "ckpt", "grpo"),
        lambda: hold_shard_file(tmp_path / "s.jsonl", "x"),
    ):
        with pytest.raises(LocksUnsupported) as refused:
            with hold():
                pytest.fail("the block ran without its lock")
        message = str(refused.value)
        assert isinstance(refused.value, UserInputError) and "\n" not in message
        assert f"flock is refused ({errno.errorcode[code]}) on {point} ({fstype}" in message, message
        assert "Set AGENTRL_LOCK_DIR to a folder on a file system whose flock every node sees" in message


def test_the_lock_directory_takes_the_locks_and_still_refuses_a_second_holder(tmp_path, monkeypatch):
    locks = tmp_path / "locks"
    folder = tmp_path / "results" / "rl" / "checkpoints"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)],
        env=_env(AGENTRL_LOCK_DIR=str(locks)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("AGENTRL_LOCK_DIR", str(locks))
        (held,) = locks.iterdir()
        assert held == lock_file(folder / LOCK_FILE, {"AGENTRL_LOCK_DIR": str(locks)})
        assert held.name.endswith("rl-checkpoints-trainer.lock") and not (folder / LOCK_FILE).exists()
        assert json.loads(held.read_text())["locks"] == str(folder / LOCK_FILE)
        with pytest.raises(CheckpointFolderInUse, match=rf"grpo process {holder.pid} on "):
            with hold_checkpoint_folder(folder, "sft"):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_mounts_are_found_by_the_longest_mount_point():
    assert mount_of(Path("/scratch/u/results"), MOUNTS)[:2] == ("/scratch", "lustre")
    assert "localflock" in mount_of(Path("/scratch/u"), MOUNTS)[2]
    assert mount_of(Path("/projects/x"), MOUNTS)[0] == "/"  # /project is not a prefix of /projects
    assert mount_of(Path("/old space/r"), MOUNTS)[:2] == ("/old space", "nfs")


@pytest.mark.parametrize(
    ("where", "refused"),
    [
        ("/scratch/u/ckpt/trainer.lock", True),
        ("/old space/ckpt/trainer.lock", True),
        ("/project/ckpt/trainer.lock", False),
    ],
)
def test_node_local_locks_are_refused_inside_a_slurm_job_only(where, refused):
    if refused:
        with pytest.raises(LocksUnsupported, match="flock locks on this node only"):
            folder_lock._refuse_node_local_locks(Path(where), {"SLURM_JOB_ID": "77"}, MOUNTS)
    else:
        folder_lock._refuse_node_local_locks(Path(where), {"SLURM_JOB_ID": "77"}, MOUNTS)
    folder_lock._refuse_node_local_locks(Path(where), {}, MOUNTS)  # one machine: the node is everything


def test_a_held_folder_names_the_slurm_job_and_the_scancel_to_run(tmp_path):
    folder = tmp_path / "checkpoints"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], env=_env(SLURM_JOB_ID="918273"), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointFolderInUse) as busy:
            with hold_checkpoint_folder(folder, "grpo"):
                pass
        message = str(busy.value)
        assert f"grpo process {holder.pid} on " in message and ", SLURM job 918273, started " in message, message
        assert "stop it: scancel 918273;" in message, message
    finally:
        holder.kill()
        holder.wait()


def test_a_held_shard_outside_slurm_names_the_signal_and_host(tmp_path):
    out = tmp_path / "0-of-2.jsonl"
    script = HOLD.replace("hold_checkpoint_folder(sys.argv[1], ", "hold_shard_file(sys.argv[1], ").replace(
        "import hold_checkpoint_folder", "import hold_shard_file"
    )
    holder = subprocess.Popen([sys.executable, "-c", script, str(out)], env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ShardFileInUse, match=rf"stop it: kill -TERM {holder.pid} on \S+ \(it keeps"):
            with hold_shard_file(out, "x", wait_s=0.0):
                pass
    finally:
        holder.kill()
        holder.wait()
