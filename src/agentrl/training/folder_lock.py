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

A holder names itself with its SLURM job id when it has one, and a refusal says how to stop it
(``scancel <id>``, else ``kill -USR1 <pid>`` on its host): under SLURM a stage whose Snakemake
died runs on in its job, where nothing on the login node reaches it.

Cluster file systems: Lustre mounted ``noflock`` refuses ``flock`` (ENOLCK, EINVAL), some others
refuse it with EOPNOTSUPP; mounted ``localflock`` (Lustre) or ``local_lock=flock|all`` / ``nolock``
(NFS) it succeeds but locks on one node only, so the guard against a trainer on another node is
gone. Both end in :class:`LocksUnsupported` (a user error: exit 2, one line) naming the mount and
the fix, ``AGENTRL_LOCK_DIR``: a folder on a file system whose locks every node sees, where the
lock files are kept instead (one per locked path, named for it). The node-local case is refused
only inside a SLURM job, whose trainer and orphan may run on two nodes; on one machine a
node-local lock is the whole guard. An environment setting, as ``AGENTRL_GPU_LOCK_DIR`` is: a
property of the site, which changes nothing a stage computes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from agentrl.errors import OutputPathError, StageInterrupted

LOCK_FILE = "trainer.lock"
SHARD_LOCK_SUFFIX = ".lock"
LOCK_DIR_SETTING = "AGENTRL_LOCK_DIR"
# What flock raises on a file system that does not lock at all (Lustre noflock: ENOLCK or EINVAL)
NO_FLOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS})
# Mount options under which flock succeeds but only this node sees the lock
NODE_LOCAL_OPTIONS = frozenset({"localflock", "local_lock=flock", "local_lock=all", "nolock"})


class CheckpointFolderInUse(RuntimeError):
    """Another live trainer holds the checkpoint folder."""


class ShardFileInUse(StageInterrupted):
    """Another live shard job writes the same shard file; the stage exits 1."""


class LocksUnsupported(OutputPathError):
    """The file system of a lock file cannot hold a lock that every node sees."""


def mount_of(path: Path, mounts: str) -> tuple[str, str, frozenset[str]]:
    """(mount point, file system type, options) of the mount holding ``path`` (absolute), read from
    ``mounts``, the text of /proc/mounts: the longest mount point above it."""
    best = ("/", "unknown", frozenset())
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point = fields[1].replace("\\040", " ")
        inside = str(path) == point or str(path).startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, fields[2], frozenset(fields[3].split(",")))
    return best


def _read_mounts() -> str:
    try:
        return Path("/proc/mounts").read_text()
    except OSError:
        return ""


def _unsupported(path: Path, why: str) -> LocksUnsupported:
    point, fstype, options = mount_of(path.resolve(), _read_mounts())
    shown = ",".join(sorted(options & NODE_LOCAL_OPTIONS)) or "its options"
    return LocksUnsupported(
        f"cannot lock {path}: {why} on {point} ({fstype}, mounted with {shown}), so two jobs could write it at "
        f"once. Set {LOCK_DIR_SETTING} to a folder on a file system whose flock every node sees (e.g. an NFSv4 or a "
        f"Lustre flock mount, or local /tmp for a run on one machine), in the environment of snakemake; the lock "
        "files go there instead"
    )


def lock_file(path: Path, env: Mapping[str, str]) -> Path:
    """Where the lock of ``path`` is: ``path`` itself, or in ``AGENTRL_LOCK_DIR`` a file named for
    ``path``'s absolute name (readable tail, hashed whole: one file per locked path)."""
    folder = env.get(LOCK_DIR_SETTING, "").strip()
    if not folder:
        return path
    absolute = str(path.resolve())
    digest = hashlib.sha256(absolute.encode()).hexdigest()[:16]
    tail = "-".join(path.resolve().parts[-3:]).replace(os.sep, "-")
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder) / f"{digest}-{tail}"


def _refuse_node_local_locks(path: Path, env: Mapping[str, str], mounts: str | None = None) -> None:
    """Inside a SLURM job, refuse a lock file whose mount locks on this node only."""
    if not env.get("SLURM_JOB_ID", "").strip():
        return
    _, _, options = mount_of(path.resolve(), _read_mounts() if mounts is None else mounts)
    if options & NODE_LOCAL_OPTIONS:
        raise _unsupported(path, "flock locks on this node only")


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        held = f"{info['stage']} process {info['pid']} on {info['host']}"
        if info.get("slurm_job"):
            held += f", SLURM job {info['slurm_job']}"
        return f"{held}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


def _how_to_stop(path: Path, signal: str, effect: str) -> str:
    """The command that stops the holder of ``path``: its SLURM job's scancel (SIGTERM to every
    process of the job: the stage stops as at a time limit), else ``signal`` on its host (``effect``)."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return "stop its process"
    if info.get("slurm_job"):
        return f"scancel {info['slurm_job']}"
    return f"kill -{signal} {info.get('pid', '<pid>')} on {info.get('host', 'its host')} ({effect})"


@contextlib.contextmanager
def _hold_lock(path: Path, stage: str, wait_s: float, busy: Callable[[str, Path], Exception]) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (made if missing) while the block runs, its holder
    written into it; waits up to ``wait_s`` for another holder to end, then raises ``busy(holder)``
    (:func:`_holder` and :func:`_how_to_stop` of the file). ``path`` moves to ``AGENTRL_LOCK_DIR``
    when set (:func:`lock_file`); a file system that cannot lock raises :class:`LocksUnsupported`."""
    target, path = path, lock_file(path, os.environ)
    _refuse_node_local_locks(path, os.environ)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise busy(_holder(path), path) from None
                time.sleep(0.5)
            except OSError as error:
                if error.errno not in NO_FLOCK:
                    raise
                raise _unsupported(
                    path, f"flock is refused ({errno.errorcode.get(error.errno, error.errno)})"
                ) from None
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "slurm_job": os.environ.get("SLURM_JOB_ID") or None,
            "stage": stage,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "locks": str(target),
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

    def busy(holder: str, lock: Path) -> Exception:
        return CheckpointFolderInUse(
            f"{folder} is in use by another trainer ({holder}); two trainers on one "
            "checkpoint folder would train the same steps twice. Wait for it to end (on one machine a "
            "trainer whose Snakemake died stops after its running step; in a SLURM job it runs on), or stop "
            f"it: {_how_to_stop(lock, 'USR1', 'checkpoint, then exit')}; then run again"
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

    def busy(holder: str, lock: Path) -> Exception:
        return ShardFileInUse(
            f"{out} is being written by another job ({holder}) after {wait_s:.0f} s of waiting; "
            f"let it end or stop it: {_how_to_stop(lock, 'TERM', 'it keeps its finished problems')}; then run again"
        )

    with _hold_lock(out.with_name(out.name + SHARD_LOCK_SUFFIX), stage, wait_s, busy):
        yield
