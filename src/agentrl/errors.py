"""Errors in what the user gave a stage (config, data files, model folders, output paths).

Each names the file and, where there is one, the row and the column or the key. ``python -m
agentrl <stage>`` prints such an error as one message without a traceback and exits with status
2, as argparse does for a bad argument; anything else is a bug or an environment failure and
keeps its traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class UserInputError(ValueError):
    """Something the user must fix in a stage's config, inputs or output paths."""


class DataFormatError(UserInputError):
    """A data file (or a row, or a column of one) does not have the documented schema, or is empty."""


class ModelFolderError(UserInputError):
    """A model folder is missing, incomplete or has an unreadable file."""


class HubSourceError(UserInputError):
    """A hub id (a data set or a model) that cannot be fetched: not in the local cache while the hub
    is offline or unreachable, or not on the hub as spelled (repository, revision or file)."""


class OutputPathError(UserInputError):
    """An output path cannot be written (checked before any work)."""


class StageInterrupted(Exception):
    """A stage that stopped before its end on purpose and can simply be run again: ``python -m
    agentrl`` prints the message as one line and exits with ``exit_code`` (1: another process
    holds its output; 75, EX_TEMPFAIL: stopped by a signal or its parent's exit, work kept)."""

    exit_code = 1


def read_json_file(path: str | Path) -> Any:
    """The JSON value in ``path``; a missing or malformed file raises DataFormatError naming the
    file and, for bad JSON, the line and column."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{path}: cannot be read ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}: line {exc.lineno}, column {exc.colno}: not JSON ({exc.msg})") from None
