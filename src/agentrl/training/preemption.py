"""Stopping a training stage cleanly: a stop request, checked at step boundaries, and a wall-time
checkpoint interval.

A cluster ends a job with a signal some minutes before killing it (SLURM: ``--signal=USR1@600``
sends SIGUSR1 600 s before the time limit; preemption sends SIGTERM, then SIGKILL after
``KillWait``). The first SIGUSR1 or SIGTERM does not interrupt anything: it sets the
:class:`StopRequest`, the running step finishes, the trainer writes a checkpoint of that step and
exits with :data:`EXIT_CODE` and a log line saying so; the retry (Snakemake ``--retries``, a
requeued SLURM job) resumes from that checkpoint, with no step repeated or skipped. A second
signal of the same kind takes its default action (the process dies at once), so a user's second
Ctrl-C-like signal is never swallowed.

Ranks agree before acting (:meth:`StepBoundary.decide` all-reduces the flags with MAX): a signal
that reached only some ranks, or wall clocks that differ between nodes, cannot make one rank save
or stop while another runs on into a collective. Other code can ask for a stop too
(:meth:`StopRequest.request`, e.g. a watchdog that sees its parent process gone).

Under torchrun the agent process is not ours: SIGTERM makes it forward SIGTERM to the workers and
SIGKILL them 30 s later, and SIGUSR1 would kill it. :func:`ignore_stop_signals_in_launcher`
(called before exec'ing torchrun) makes the agent ignore SIGUSR1, so the signal that SLURM
delivers to every process of the job reaches the workers and the job survives to checkpoint.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

log = logging.getLogger("agentrl.training")

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGTERM)
# EX_TEMPFAIL (sysexits.h): "try again later" - the checkpoint is written, a rerun resumes it.
EXIT_CODE = 75


class StopRequest:
    """A flag set by a stop signal (or by :meth:`request`); read at step boundaries only."""

    def __init__(self) -> None:
        self.reason: str | None = None

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def _on_signal(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        # A second signal of this kind takes the default action: the process dies at once.
        signal.signal(signum, signal.SIG_DFL)
        log.warning("%s received: stopping after the running step, with a checkpoint", name)
        self.request(name)


@contextmanager
def stop_on_signals(signals: Sequence[signal.Signals] = STOP_SIGNALS) -> Iterator[StopRequest]:
    """A :class:`StopRequest` that ``signals`` set while the block runs; the previous handlers
    come back afterwards. Outside the main thread (where Python cannot install handlers) the
    request only reacts to :meth:`StopRequest.request`."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.signal(sig, stop._on_signal) for sig in signals}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def ignore_stop_signals_in_launcher() -> None:
    """Ignore SIGUSR1 in this process before it execs a launcher (torchrun, srun).

    An ignored disposition survives ``exec``, so torchrun's agent outlives the signal while the
    workers, which install their own handler (:func:`stop_on_signals`), receive it.
    """
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


class CheckpointClock:
    """Due when ``minutes`` of wall time have passed since the last checkpoint (None or 0: never).

    A step interval alone loses up to ``save_every_steps`` steps to a crash; at paper scale 30
    GRPO steps are about ten hours. The clock bounds the loss in time instead.
    """

    def __init__(self, minutes: float | None, now=time.monotonic) -> None:
        self.seconds = (minutes or 0) * 60.0
        self._now = now
        self._last = now()

    def due(self) -> bool:
        return self.seconds > 0 and self._now() - self._last >= self.seconds

    def reset(self) -> None:
        self._last = self._now()


@dataclass(frozen=True)
class Decision:
    save: bool  # write a checkpoint of this step
    stop: bool  # then exit with EXIT_CODE
    reason: str  # why: "step interval", "wall-time interval" or the stop signal's name


def _any_rank(flags: Sequence[bool], device: torch.device) -> list[bool]:
    """Each flag OR-ed over the ranks (one MAX all-reduce; free without a process group)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(flags)
    tensor = torch.tensor([float(f) for f in flags], dtype=torch.float32, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [bool(v) for v in tensor.tolist()]


class StepBoundary:
    """Decides, after each step and the same on every rank, whether to checkpoint and whether to stop.

    ``save`` = the caller's step interval is due OR the wall-time interval is due OR a stop is
    requested; ``stop`` = a stop is requested. After the last step neither the clock nor a stop
    request count: the run just finishes and writes its final model.
    """

    def __init__(self, stop: StopRequest, clock: CheckpointClock, device: torch.device) -> None:
        self.stop = stop
        self.clock = clock
        self.device = device

    def decide(self, *, step_interval_due: bool, last_step: bool) -> Decision:
        interval, clock, stop = _any_rank([step_interval_due, self.clock.due(), self.stop.requested], self.device)
        stop, clock = stop and not last_step, clock and not last_step
        reason = (self.stop.reason or "a stop request on another rank") if stop else ""
        if not reason:
            reason = "step interval" if interval else "wall-time interval" if clock else ""
        return Decision(save=interval or clock or stop, stop=stop, reason=reason)

    def saved(self) -> None:
        self.clock.reset()


class StoppedForRetry(Exception):
    """Raised by a trainer after the checkpoint of ``step`` is written on a stop request."""

    def __init__(self, stage: str, step: int, checkpoint_dir, reason: str) -> None:
        self.step = step
        super().__init__(
            f"{stage}: stopped on {reason} after step {step}; its checkpoint is in {checkpoint_dir}, "
            f"and running the same command again resumes from it (exit code {EXIT_CODE})"
        )
