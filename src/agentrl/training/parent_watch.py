"""A training stage whose parent died stops at its next step boundary.

After ``kill -9 <snakemake>`` the job's shell and the stage under it live on: nobody will
collect the stage's outputs, and the recovery recipe (``snakemake --unlock``, then
``--rerun-incomplete``) starts a second trainer on the same checkpoint folder. So a stage
records its ancestor processes when it starts (parent, grandparent, ... up to, not including,
pid 1) and a daemon thread looks at them every few seconds; when one has exited (or its pid now
belongs to another process), it sets the stage's :class:`~agentrl.training.preemption.StopRequest`.
The stage then finishes its running step, writes a checkpoint and exits with the preemption
exit code, as on SIGUSR1, so the rerun resumes from that step.

A stage meant to outlive the shell that started it should be started under something that stays
(tmux, screen, a batch job), not left behind by an exiting shell.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agentrl.training.preemption import StopRequest

log = logging.getLogger("agentrl.training")

CHECK_EVERY_S = 2.0


@dataclass(frozen=True)
class Process:
    pid: int
    name: str
    started: int  # clock ticks after boot (field 22 of /proc/<pid>/stat): tells a reused pid apart


def _read(pid: int) -> tuple[Process, int] | None:
    """(the process, its parent's pid) from ``/proc/<pid>/stat``, or None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 (state) on
    return Process(pid, name, int(fields[19])), int(fields[1])


def ancestors(pid: int | None = None) -> list[Process]:
    """The processes above ``pid`` (default: this one), nearest first, pid 1 left out."""
    found: list[Process] = []
    entry = _read(pid or os.getpid())
    while entry is not None and entry[1] > 1:
        entry = _read(entry[1])
        if entry is not None:
            found.append(entry[0])
    return found


def _exited(process: Process) -> bool:
    entry = _read(process.pid)
    return entry is None or entry[0].started != process.started


@contextlib.contextmanager
def watch_ancestors(on_exit: Callable[[Process], None], every_s: float = CHECK_EVERY_S) -> Iterator[None]:
    """Call ``on_exit(process)`` once, from a daemon thread, when one of this process's ancestors
    exits, while the block runs (Linux: reads ``/proc``; elsewhere nothing is watched)."""
    watched = ancestors() if Path("/proc/self/stat").exists() else []
    finished = threading.Event()

    def watch() -> None:
        while not finished.wait(every_s):
            gone = next((p for p in watched if _exited(p)), None)
            if gone is not None:
                on_exit(gone)
                return

    thread = threading.Thread(target=watch, name="agentrl-parent-watch", daemon=True)
    if watched:
        thread.start()
    try:
        yield
    finally:
        finished.set()
        if watched:
            thread.join()


@contextlib.contextmanager
def stop_when_orphaned(stop: StopRequest, every_s: float = CHECK_EVERY_S) -> Iterator[None]:
    """Set ``stop`` when one of this process's ancestors exits, while the block runs."""

    def on_exit(gone: Process) -> None:
        log.warning(
            "parent process %d (%s) exited: stopping after the running step, with a checkpoint", gone.pid, gone.name
        )
        stop.request(f"the exit of parent process {gone.pid} ({gone.name})")

    with watch_ancestors(on_exit, every_s):
        yield
