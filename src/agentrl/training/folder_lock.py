"""One trainer per checkpoint folder: an exclusive lock that a training stage holds for its lifetime.

Two trainers on one folder write the same steps twice, interleave their metrics and prune each
other's checkpoints; it happened after ``kill -9 <snakemake>`` (the orphaned stage trained on)
followed by the recovery recipe (``snakemake --unlock``, ``--rerun-incomplete``), which started a
second one. Rank 0 takes an advisory ``flock`` on ``<checkpoints>/trainer.lock`` before it reads
or writes anything there and keeps it until it exits; the kernel releases it when the process
ends, however it ends, so a killed trainer never leaves a stale lock. A second trainer refuses
at once with a message naming the holder (pid, host, stage, start time, written into the file).

The lock file stays in the folder (deleting it would race with a trainer opening it); it is not
a checkpoint and nothing reads it but this module.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "trainer.lock"


class CheckpointFolderInUse(RuntimeError):
    """Another live trainer holds the checkpoint folder."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        return f"{info['stage']} process {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


@contextlib.contextmanager
def hold_checkpoint_folder(folder: str | Path, stage: str) -> Iterator[None]:
    """Hold ``folder``'s trainer lock while the block runs (rank 0 only; the other ranks of a job
    share rank 0's lock). Raises :class:`CheckpointFolderInUse` when another trainer holds it."""
    if int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointFolderInUse(
                f"{folder} is in use by another trainer ({_holder(path)}); two trainers on one "
                "checkpoint folder would train the same steps twice. Wait for it to end (a trainer "
                "whose Snakemake died stops after its running step, with a checkpoint), or stop it "
                "with SIGUSR1 (checkpoint, then exit), then run again"
            ) from None
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "stage": stage,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
