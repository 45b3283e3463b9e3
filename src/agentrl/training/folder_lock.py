"""One trainer per checkpoint folder, one writer per shard file: exclusive locks held for a lifetime.

Two trainers on one folder write the same steps twice, interleave their metrics and prune each
other's checkpoints; it happened after ``kill -9 <snakemake>`` (the orphaned stage trained on)
followed by the recovery recipe (``snakemake --unlock``, ``--rerun-incomplete``), which started a
second one. Rank 0 takes an advisory ``flock`` on ``<checkpoints>/trainer.lock`` before it reads
or writes anything there and keeps it until it exits; the kernel releases it when the process
ends, however it ends, so a killed trainer never leaves a stale lock. A second trainer refuses
at once with a message naming the holder (pid, host, stage, start time, written into the file).

Shard jobs (scoring, evaluation) lock ``<shard file>.lock`` the same way
(:func:`hold_shard_file`); a rerun waits a minute for an orphan still stopping rather than fail.

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
from collections.abc import Callable, Iterator
from pathlib import Path

from agentrl.errors import StageInterrupted

LOCK_FILE = "trainer.lock"
SHARD_LOCK_SUFFIX = ".lock"


class CheckpointFolderInUse(RuntimeError):
    """Another live trainer holds the checkpoint folder."""


class ShardFileInUse(StageInterrupted):
    """Another live shard job writes the same shard file; the stage exits 1."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        return f"{info['stage']} process {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


@contextlib.contextmanager
def _hold_lock(path: Path, stage: str, wait_s: float, busy: Callable[[str], Exception]) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (made if missing) while the block runs, its holder
    written into it; waits up to ``wait_s`` for another holder to end, then raises ``busy(holder)``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise busy(_holder(path)) from None
                time.sleep(0.5)
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


@contextlib.contextmanager
def hold_checkpoint_folder(folder: str | Path, stage: str) -> Iterator[None]:
    """Hold ``folder``'s trainer lock while the block runs (rank 0 only; the other ranks of a job
    share rank 0's lock). Raises :class:`CheckpointFolderInUse` when another trainer holds it."""
    if int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def busy(holder: str) -> Exception:
        return CheckpointFolderInUse(
            f"{folder} is in use by another trainer ({holder}); two trainers on one "
            "checkpoint folder would train the same steps twice. Wait for it to end (a trainer "
            "whose Snakemake died stops after its running step, with a checkpoint), or stop it "
            "with SIGUSR1 (checkpoint, then exit), then run again"
        )

    with _hold_lock(folder / LOCK_FILE, stage, 0.0, busy):
        yield


# An orphaned shard job stops within seconds of its parent's exit (:mod:`agentrl.sampling.shards`):
# a rerun started meanwhile waits this long for it rather than failing.
SHARD_LOCK_WAIT_S = 60.0


@contextlib.contextmanager
def hold_shard_file(out: str | Path, stage: str, wait_s: float = SHARD_LOCK_WAIT_S) -> Iterator[None]:
    """Hold the lock ``<shard file>.lock`` while the block runs: one writer per shard file, so an
    orphaned job and its rerun never write the same partial file. Raises :class:`ShardFileInUse`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def busy(holder: str) -> Exception:
        return ShardFileInUse(
            f"{out} is being written by another job ({holder}) after {wait_s:.0f} s of waiting; "
            "stop it (SIGTERM keeps its finished problems) or let it end, then run again"
        )

    with _hold_lock(out.with_name(out.name + SHARD_LOCK_SUFFIX), stage, wait_s, busy):
        yield
