"""Per-step metrics of a training stage: one JSON line per step, written by rank 0.

One resume rule for SFT and GRPO: a checkpoint carries the records of the steps it contains, and
a run that resumes from it rewrites the file with those records (:meth:`MetricsWriter.reset`)
before it appends the next step. Lines a killed run wrote after its checkpoint (steps that run
again) disappear, and a metrics file that Snakemake removed with a failed job's outputs comes
back. Each line is flushed and synced, so a kill loses at most the line being written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import DataFormatError


class MetricsWriter:
    """Appends step records to a JSON-lines file; ``echo`` sees each record after it is written
    (GRPO's console line), ``tracker`` (TensorBoard, W&B: :class:`agentrl.tracking.Tracker`) its numbers."""

    def __init__(
        self,
        path: str | Path,
        echo: Callable[[Mapping[str, Any]], None] | None = None,
        tracker: Any = None,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.echo = echo
        self.tracker = tracker

    def reset(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Replace the file's content by ``records`` (on resume: the checkpoint's records)."""
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for record in records:
                fh.write(json.dumps(record, sort_keys=True) + "\n")
        tmp.replace(self.path)

    def write(self, record: Mapping[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if self.echo is not None:
            self.echo(record)
        if self.tracker is not None:
            self.tracker.log(record, record["step"])

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics file (``[]`` when it does not exist); a bad line names its number."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                try:
                    records.append(json.loads(line.rstrip("\r\n")))
                except json.JSONDecodeError as exc:
                    raise DataFormatError(f"{path}: line {number}, column {exc.colno}: not JSON ({exc.msg})") from None
    return records
