"""Curves to watch a run by: TensorBoard and Weights & Biases (config ``tracking``).

Each SFT, GRPO or evaluation job writes into ``<folder>/tracking/`` beside its metrics file
(``tensorboard/`` event files; ``wandb/`` run files), so ``tensorboard --logdir results`` shows
every stage. The metrics files stay the record the report reads; tracking only mirrors their
numbers, which is why the section is ``x-rerun: false``.

A package that is missing is found before any work: :func:`check_tracking` names the key and
the install command (the workflow runs it at load, the stages before they train).
"""

from __future__ import annotations

import importlib
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.config import ConfigError, TrackingConfig

_PACKAGES = {"tensorboard": ("tracking.tensorboard", "pip install tensorboard"), "wandb": ("tracking.wandb.enable", "pip install -e '.[wandb]'")}  # fmt: skip


def missing_packages(cfg: TrackingConfig) -> list[str]:
    """The packages the tracking settings need that cannot be imported here."""
    wanted = (["tensorboard"] if cfg.tensorboard else []) + (["wandb"] if cfg.wandb.enable else [])
    missing = []
    for name in wanted:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def check_tracking(cfg: TrackingConfig) -> None:
    """Raise ConfigError naming each tracking key whose package is not installed."""
    missing = missing_packages(cfg)
    if missing:
        lines = [f"  - {_PACKAGES[name][0]} is on but {name} is not installed: {_PACKAGES[name][1]}, " f"or set {_PACKAGES[name][0]}: false" for name in missing]  # fmt: skip
        raise ConfigError("tracking: a package is missing\n" + "\n".join(lines))


def _numbers(record: Mapping[str, Any]) -> dict[str, float]:
    return {
        key: float(value)
        for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class Tracker:
    """One job's TensorBoard writer and W&B run; :meth:`log` takes a metrics record.

    ``fresh``: the job starts from nothing (not resumed), so earlier curves in the folder are
    removed, as the metrics file is rewritten. A resumed job continues the same W&B run (its id
    is kept in ``tracking/wandb/run_id``).
    """

    def __init__(
        self,
        cfg: TrackingConfig,
        folder: str | Path,
        name: str,
        fresh: bool,
        run_config: Mapping[str, Any] | None = None,
    ) -> None:
        check_tracking(cfg)
        self.folder = Path(folder) / "tracking"
        self.tensorboard = self.wandb = None
        if cfg.tensorboard:
            # tensorboard's own event writer (what torch's SummaryWriter wraps): the gather job of
            # an evaluation runs in envs/report.yaml, which has no torch
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            if fresh:
                shutil.rmtree(self.folder / "tensorboard", ignore_errors=True)
            self.tensorboard = EventFileWriter(str(self.folder / "tensorboard"))
        if cfg.wandb.enable:
            self.wandb = self._wandb_run(cfg, name, fresh, dict(run_config or {}))

    def _wandb_run(self, cfg: TrackingConfig, name: str, fresh: bool, run_config: dict[str, Any]) -> Any:
        import wandb

        folder = self.folder / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / "run_id"
        if fresh or not id_file.exists():
            id_file.write_text(uuid.uuid4().hex[:16])
        return wandb.init(
            project=cfg.wandb.project,
            entity=cfg.wandb.entity,
            mode=cfg.wandb.mode,
            dir=str(folder),
            name=name,
            id=id_file.read_text().strip(),
            resume="allow",
            config=run_config,
        )

    def log(self, record: Mapping[str, Any], step: int | None = None) -> None:
        step = int(record.get("step", 0)) if step is None else step
        numbers = _numbers(record)
        if self.tensorboard is not None and numbers:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary

            values = [Summary.Value(tag=key, simple_value=value) for key, value in numbers.items()]
            self.tensorboard.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log(numbers, step=step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()
