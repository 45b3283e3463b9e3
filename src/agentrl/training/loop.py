"""The training loop SFT and GRPO share: what happens around a step, the same for both stages.

A stage brings its step (``run_step(step) -> record``, the optimizer update and the numbers it
measured) and how to write its checkpoint (``save(step, records)``); :class:`TrainingLoop` does
the rest, so the two stages cannot drift apart on it:

- rank 0 alone writes the metrics file and the curves (:class:`~agentrl.training.metrics.MetricsWriter`,
  :class:`~agentrl.tracking.Tracker`), other ranks keep the records too (every rank saves them
  in its checkpoint); a run from step 0 replaces the old curves as it rewrites the file;
- after each step, the step boundary (:class:`~agentrl.training.preemption.StepBoundary`), the
  same on every rank: checkpoint when the stage's step interval, the wall-time interval or a
  stop request says so, then stop with :class:`~agentrl.training.preemption.StoppedForRetry`
  on a stop request (a signal, or the parent's exit: :mod:`agentrl.training.parent_watch`) or
  when the SLURM job's time limit is near (``save_before_end_minutes``);
- the progress bar, and the writer's close however the loop ends.

:func:`training_stage` holds what a stage holds for its whole run: the checkpoint folder's lock,
the stop signals, the parent watch and the collective-timeout message naming its config key.
Steps are numbered from 1: step k is the k-th optimizer step of the run, the number its
metrics record, its checkpoint folder and a resumed run's start carry.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from agentrl.config import TrackingConfig
from agentrl.progress import progress as make_progress
from agentrl.tracking import Tracker
from agentrl.training import deepspeed_engine as dse
from agentrl.training.folder_lock import hold_checkpoint_folder
from agentrl.training.metrics import MetricsWriter
from agentrl.training.parent_watch import stop_when_orphaned
from agentrl.training.preemption import (
    CheckpointClock,
    StepBoundary,
    StoppedForRetry,
    StopRequest,
    TimeLimitClock,
    job_end_time,
    stop_on_signals,
)

Record = dict[str, Any]


@contextlib.contextmanager
def training_stage(stage: str, checkpoint_dir: Path, timeout_key: str, timeout_minutes: float) -> Iterator[StopRequest]:
    """The stop request of a training stage's run, with the run's guards held around it.

    The checkpoint folder is locked (:mod:`agentrl.training.folder_lock`: a second trainer on
    it refuses); SIGUSR1 and SIGTERM, and the exit of the parent process, set the request; a
    collective that times out is re-raised naming ``timeout_key``.
    """
    with hold_checkpoint_folder(checkpoint_dir, stage), stop_on_signals() as stop:
        with stop_when_orphaned(stop), dse.collective_timeout_named(timeout_key, timeout_minutes):
            yield stop


class TrainingLoop:
    """Runs a stage's steps from ``start + 1`` to ``total_steps`` with metrics, checkpoints and stops.

    ``records`` are the metric records of the steps before ``start`` (a resumed checkpoint's):
    the metrics file is rewritten with them first (:meth:`MetricsWriter.reset`), so lines of
    steps that run again disappear. ``tracking`` (None: no curves) and ``run_config`` go to the
    :class:`~agentrl.tracking.Tracker` in ``tracking_folder``; ``echo`` sees each record written.
    ``save_before_end_minutes`` (None: never): the margin before the SLURM job's time limit
    (:class:`~agentrl.training.preemption.TimeLimitClock`).
    """

    def __init__(
        self,
        stage: str,
        ctx: dse.DistributedContext,
        stop: StopRequest,
        *,
        start: int,
        total_steps: int,
        records: list[Record],
        metrics: Path,
        checkpoint_dir: Path,
        save_every_minutes: float | None,
        save_before_end_minutes: float | None = None,
        tracking: TrackingConfig | None = None,
        tracking_folder: Path | None = None,
        run_config: Mapping[str, Any] | None = None,
        echo: Callable[[Mapping[str, Any]], None] | None = None,
        log: logging.Logger,
    ) -> None:
        self.stage, self.start, self.total_steps = stage, start, total_steps
        self.records, self.checkpoint_dir = records, checkpoint_dir
        self.stop, self.save_every_minutes, self.device = stop, save_every_minutes, ctx.device
        self.save_before_end_minutes = save_before_end_minutes
        self.writer = None
        if ctx.is_main:
            folder = tracking_folder if tracking_folder is not None else metrics.parent
            tracker = Tracker(tracking, folder, stage, fresh=start == 0, run_config=run_config) if tracking else None
            self.writer = MetricsWriter(metrics, echo, tracker)
            self.writer.reset(records)
            log.info("metrics: %s, one line per step as it runs", metrics)
        self.is_main, self.log = ctx.is_main, log
        self.progress = None

    def emit(self, record: Record) -> None:
        """Keep ``record`` (for the checkpoints) and, on rank 0, write it."""
        self.records.append(record)
        if self.writer is not None:
            self.writer.write(record)

    def run(
        self,
        run_step: Callable[[int], Record],
        save: Callable[[int, list[Record]], None],
        interval_due: Callable[[int], bool],
        postfix: Callable[[Record], Mapping[str, str]] | None = None,
    ) -> Record:
        """Run the steps; returns the last record of this run ({} when none ran).

        After step k: ``interval_due(k)`` is the stage's step interval (whether the last step
        gets a checkpoint too is the stage's choice); a save calls ``save(k, records)`` on every
        rank. The writer and the bar are closed whether the loop ends, stops or fails.
        """
        record: Record = {}
        # Made when the steps start: the wall-time interval and the bar's rate count steps, not
        # what a stage does before them (GRPO's validation before training).
        boundary = StepBoundary(self.stop, CheckpointClock(self.save_every_minutes), self.device, self._time_limit())
        self.progress = make_progress(
            self.total_steps, self.stage, unit="steps", initial=self.start, disable=not self.is_main, logger=self.log
        )
        try:
            for step in range(self.start + 1, self.total_steps + 1):
                began = time.monotonic()
                record = run_step(step)
                took = time.monotonic() - began
                self.emit(record)
                if postfix is not None:
                    self.progress.set_postfix(**postfix(record))
                self.progress.update(1)
                last = step == self.total_steps
                decision = boundary.decide(step_interval_due=interval_due(step), last_step=last, step_seconds=took)
                if decision.save:
                    save(step, self.records)
                    boundary.saved()
                if decision.stop:
                    raise StoppedForRetry(self.stage, step, self.checkpoint_dir, decision.reason)
        finally:
            self.close()
        return record

    def _time_limit(self) -> TimeLimitClock:
        """The clock of the SLURM job's time limit (rank 0 asks squeue; the ranks agree at each boundary)."""
        end = job_end_time(ask_squeue=self.is_main) if self.save_before_end_minutes is not None else None
        if end is not None and self.is_main:
            self.log.info(
                "the SLURM job ends at %s: a checkpoint is written and the stage stops (exit 75, resumed by the "
                "next attempt) once a step would end within %g minutes of it",
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(end)),
                self.save_before_end_minutes,
            )
        return TimeLimitClock(end, self.save_before_end_minutes)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None
