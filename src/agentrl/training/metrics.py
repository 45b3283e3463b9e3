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
    (GRPO's console line), TensorBoard gets its numbers when ``tensorboard_dir`` is given."""

    def __init__(
        self,
        path: str | Path,
        echo: Callable[[Mapping[str, Any]], None] | None = None,
        tensorboard_dir: str | Path | None = None,
        tensorboard_key: str = "grpo.tensorboard",
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.echo = echo
        self.tensorboard = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise RuntimeError(
                    f"{tensorboard_key} is on but TensorBoard cannot be imported ({exc}); "
                    f"pip install tensorboard, or set {tensorboard_key}: false"
                ) from None
            self.tensorboard = SummaryWriter(str(tensorboard_dir))

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
        if self.tensorboard is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tensorboard.add_scalar(key, value, record["step"])
            self.tensorboard.flush()

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


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
