"""Checkpoint folders that are complete or absent: written aside and renamed, checked before a resume.

A save writes ``<checkpoints>/step_<n>.partial/``, records every file's size in ``files.json``
and renames the folder to ``step_<n>`` when all ranks are done, then points ``latest`` at it: a
kill or a full disk mid-save never leaves a half-written step under its final name. A resume
takes the newest ``step_<n>`` whose files all have their recorded sizes and whose trainer state
reads (:func:`choose_checkpoint`); a newer damaged one (a truncated file, a ``latest`` naming a
folder that is gone, a trainer state cut short) is named in a warning and moved aside to
``step_<n>.damaged``, so that pruning never counts it, and training goes on from the intact one.
``keep_checkpoints: 2`` keeps that previous checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.config import ConfigError

MANIFEST = "files.json"
PARTIAL_SUFFIX = ".partial"
DAMAGED_SUFFIX = ".damaged"
LATEST = "latest"
TRAINER_STATE = "trainer_state.json"
# Below this much free space a failed write is put down to a full disk.
NEARLY_FULL_BYTES = 64 << 20


class CheckpointsDamaged(ConfigError):
    """Every checkpoint in the folder is damaged: nothing to resume, and training from step 0 over
    them would hide that. The stage exits 2 naming what is wrong with each."""


class CheckpointWriteFailed(RuntimeError):
    """A checkpoint could not be written (the disk is full); the message names the folder."""


def step_of(folder: Path) -> int | None:
    digits = folder.name.removeprefix("step_")
    return int(digits) if folder.name.startswith("step_") and digits.isdigit() else None


def step_folders(checkpoint_dir: Path) -> list[Path]:
    """The ``step_<n>`` folders, newest first."""
    found = [p for p in checkpoint_dir.glob("step_*") if step_of(p) is not None and p.is_dir()]
    return sorted(found, key=lambda p: -step_of(p))


def write_manifest(tag_dir: Path) -> None:
    """``files.json``: the size of every file under ``tag_dir``, read back by :func:`damage_of`."""
    sizes = {
        str(path.relative_to(tag_dir)): path.stat().st_size
        for path in sorted(tag_dir.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }
    tmp = tag_dir / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps(sizes, indent=1, sort_keys=True))
    tmp.replace(tag_dir / MANIFEST)


def damage_of(tag_dir: Path) -> str | None:
    """What is wrong with the checkpoint folder ``tag_dir``, or None when it is complete."""
    if not tag_dir.is_dir():
        return f"{tag_dir} does not exist"
    try:
        sizes = json.loads((tag_dir / MANIFEST).read_text())
    except FileNotFoundError:
        sizes = None  # written before sizes were recorded: the trainer state and model states must be there
    except (OSError, ValueError) as exc:
        return f"{tag_dir / MANIFEST} cannot be read ({exc})"
    if sizes is not None:
        for name, size in sizes.items():
            path = tag_dir / name
            if not path.is_file():
                return f"{path} is missing"
            if path.stat().st_size != size:
                return f"{path} has {path.stat().st_size} bytes, {size} were written (truncated)"
    elif not any(tag_dir.glob("*model_states.pt")):
        return f"{tag_dir} has no model states"
    try:
        state = json.loads((tag_dir / TRAINER_STATE).read_text())
    except FileNotFoundError:
        return f"{tag_dir / TRAINER_STATE} is missing"
    except (OSError, ValueError) as exc:
        return f"{tag_dir / TRAINER_STATE} cannot be read ({exc})"
    if not isinstance(state, dict) or state.get("step") != step_of(tag_dir):
        return f"{tag_dir / TRAINER_STATE} is not the trainer state of step {step_of(tag_dir)}"
    return None


def choose_checkpoint(
    checkpoint_dir: str | Path, logger: logging.Logger | None = None, *, repair: bool = True
) -> tuple[str, dict[str, Any]] | None:
    """(tag, trainer state) of the newest intact checkpoint, or None when the folder holds none.

    Each newer damaged one is named in a warning on ``logger`` and, with ``repair``, moved aside
    to ``step_<n>.damaged`` and ``latest`` pointed at the chosen one. Raises
    :class:`CheckpointsDamaged` when there are checkpoints and none is intact.
    """
    checkpoint_dir = Path(checkpoint_dir)
    pointer = checkpoint_dir / LATEST
    named = pointer.read_text().strip() if pointer.is_file() else None
    problems = []
    if named is not None and not (checkpoint_dir / named).is_dir():
        problems.append(f"{pointer} names {named}, which does not exist")
    for folder in step_folders(checkpoint_dir):
        damage = damage_of(folder)
        if damage is None:
            for problem in problems:
                if logger is not None:
                    logger.warning("damaged checkpoint: %s; resuming from %s instead", problem, folder.name)
            if repair:
                _repair(checkpoint_dir, folder.name, named)
            return folder.name, json.loads((folder / TRAINER_STATE).read_text())
        problems.append(damage)
        if repair:
            aside = folder.with_name(folder.name + DAMAGED_SUFFIX)
            shutil.rmtree(aside, ignore_errors=True)
            folder.rename(aside)
    if problems:
        raise CheckpointsDamaged(
            f"{checkpoint_dir}: no intact checkpoint to resume: "
            + "; ".join(problems)
            + f". Move the folder aside (mv {checkpoint_dir} {checkpoint_dir}.damaged) to train from step 0"
        )
    return None


def _repair(checkpoint_dir: Path, tag: str, named: str | None) -> None:
    if named != tag:
        tmp = checkpoint_dir / f"{LATEST}.tmp"
        tmp.write_text(tag)
        tmp.replace(checkpoint_dir / LATEST)


@contextlib.contextmanager
def naming_a_full_disk(folder: Path) -> Iterator[None]:
    """Turn a write failure for want of space (ENOSPC, or torch's "unexpected pos" from its zip
    writer) into :class:`CheckpointWriteFailed` naming ``folder`` and the free space."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        free = shutil.disk_usage(existing).free
        full = (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or free < NEARLY_FULL_BYTES
        if not (full or "No space left" in str(exc)):
            raise
        raise CheckpointWriteFailed(
            f"writing the checkpoint {folder} failed: the disk is full ({free / 2**20:.0f} MiB free on "
            f"the file system of {existing}; {type(exc).__name__}: {str(exc).splitlines()[0][:200]}). "
            "Free space there (or lower keep_checkpoints) and run again: it resumes from the previous checkpoint"
        ) from exc


def remove_partial(checkpoint_dir: Path) -> None:
    """Remove the ``step_<n>.partial`` folders a killed or failed save left."""
    for stale in checkpoint_dir.glob(f"step_*{PARTIAL_SUFFIX}"):
        shutil.rmtree(stale, ignore_errors=True)


def fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
