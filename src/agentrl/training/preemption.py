"""Stopping a training stage cleanly: a stop request, checked at step boundaries, a wall-time
checkpoint interval and the SLURM job's time limit.

A SLURM job that reaches its time limit gets SIGTERM, then SIGKILL after ``KillWait`` (30 s by
default): too little for a step at paper scale, and a ``--signal=USR1@600`` ahead of it kills the
job step's own snakemake (it handles SIGTERM only), which ends the step and the trainer with it.
So the trainer does not wait for a signal: it reads the job's end time when its steps start
(:func:`job_end_time`) and, when one more step as long as the longest so far would end within
``save_before_end_minutes`` of it (:class:`TimeLimitClock`), writes a checkpoint after the step
it just finished and exits with :data:`EXIT_CODE`: the job fails, Snakemake submits it again
(``retries``) and the new job resumes from that checkpoint.

Preemption sends SIGTERM, then SIGKILL after ``KillWait``. The first SIGUSR1 or SIGTERM does not
interrupt anything: it sets the :class:`StopRequest`, the running step finishes, the trainer
writes a checkpoint of that step and exits with :data:`EXIT_CODE` and a log line saying so; the
retry (Snakemake ``--retries``, a requeued SLURM job) resumes from that checkpoint, with no step
repeated or skipped. A second
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
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

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


END_TIME_VARIABLE = "SLURM_JOB_END_TIME"


def job_end_time(env: Mapping[str, str] | None = None, ask_squeue: bool = True) -> float | None:
    """When the SLURM job this process runs in reaches its time limit (seconds since the epoch).

    ``SLURM_JOB_END_TIME`` where the environment has it; else (the job-step plugin passes a job's
    command no ``SLURM_*`` variable but the job id) ``squeue -j $SLURM_JOB_ID -h -o %e``, which prints
    it in local time. None outside a SLURM job, for a job without a limit, or when squeue cannot say
    (a warning: the job then ends at its limit without this checkpoint).
    """
    env = os.environ if env is None else env
    given = env.get(END_TIME_VARIABLE, "").strip()
    if given.isdigit():
        return float(given)
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job or not ask_squeue:
        return None
    try:
        done = subprocess.run(["squeue", "-j", job, "-h", "-o", "%e"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("cannot read the end time of SLURM job %s (%s): no checkpoint before its time limit", job, error)
        return None
    text = done.stdout.strip()
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:  # N/A, Unknown, NONE: no limit; or squeue failed
        if done.returncode != 0:
            log.warning("squeue -j %s failed (%s): no checkpoint before its time limit", job, done.stderr.strip()[:200])
        return None


class TimeLimitClock:
    """Due when one more step as long as the longest one seen would end within ``minutes`` of
    ``end`` (the job's end time, :func:`job_end_time`; None: never due). The margin is for the
    checkpoint's writing and the stage's exit; the step estimate keeps a long step from being
    started that the time limit would cut short."""

    def __init__(self, end: float | None, minutes: float | None, now=time.time) -> None:
        self.end = end if minutes is not None else None
        self.margin = (minutes or 0) * 60.0
        self.longest_step = 0.0
        self._now = now

    def step_took(self, seconds: float) -> None:
        self.longest_step = max(self.longest_step, seconds)

    def due(self) -> bool:
        return self.end is not None and self._now() + self.longest_step + self.margin >= self.end

    def reason(self) -> str:
        left = (self.end or 0) - self._now()
        return (
            f"the SLURM job's time limit ({left / 60:.1f} min left, a step takes up to {self.longest_step:.0f} s, "
            f"save_before_end_minutes {self.margin / 60:g})"
        )


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
    requested OR the time limit is near (``time_limit``); ``stop`` = a stop is requested or the
    time limit is near. After the last step neither the clocks nor a stop request count: the run
    just finishes and writes its final model.
    """

    def __init__(
        self, stop: StopRequest, clock: CheckpointClock, device: torch.device, time_limit: TimeLimitClock | None = None
    ) -> None:
        self.stop = stop
        self.clock = clock
        self.device = device
        self.time_limit = time_limit or TimeLimitClock(None, None)

    def decide(self, *, step_interval_due: bool, last_step: bool, step_seconds: float = 0.0) -> Decision:
        """``step_seconds``: how long the step just finished took (the time limit's estimate)."""
        self.time_limit.step_took(step_seconds)
        flags = [step_interval_due, self.clock.due(), self.stop.requested, self.time_limit.due()]
        interval, clock, stop, ending = _any_rank(flags, self.device)
        stop, clock, ending = stop and not last_step, clock and not last_step, ending and not last_step
        reason = (self.stop.reason or "a stop request on another rank") if stop else ""
        if not reason and ending:
            reason = self.time_limit.reason() if self.time_limit.due() else "the time limit, seen on another rank"
        if not reason:
            reason = "step interval" if interval else "wall-time interval" if clock else ""
        return Decision(save=interval or clock or stop or ending, stop=stop or ending, reason=reason)

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
