"""Checks of the paths a stage is given, made before any work (loading a model, training, sampling).

A stage that trained for an hour and then found its ``--out`` unwritable lost the hour, and one
that wrote some outputs before failing on the next left a run that looks complete; so each stage
CLI calls :func:`check_writable` on all of its outputs first.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from agentrl.errors import OutputPathError


def check_writable(*outputs: tuple[str | Path | None, str] | tuple[str | Path | None, str, str]) -> None:
    """Raise OutputPathError unless each ``(path, what)`` can be written: its folder can be made and
    a file created in it (``path`` itself when it is an existing folder, e.g. a checkpoint folder).

    ``what`` names the argument (``--out``). A third element, ``"file"`` or ``"folder"``, is what
    the stage writes there: an existing path of the other kind is refused (a stage that found its
    ``--out`` folder to be a file only at save would have trained for nothing). ``None`` paths
    (an optional output not asked for) are skipped. Only the missing parent folders are left behind.
    """
    for path, what, *kind in outputs:
        if path is None:
            continue
        path = Path(path)
        if kind == ["folder"] and (path.exists() or path.is_symlink()) and not path.is_dir():
            raise OutputPathError(f"{what} {path}: exists and is not a folder (this output is a folder)")
        if kind == ["file"] and path.is_dir():
            raise OutputPathError(f"{what} {path}: is an existing folder (this output is a file)")
        directory = path if path.is_dir() else path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
            handle, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".write-probe", dir=directory)
            os.close(handle)
            os.unlink(probe)
        except OSError as exc:
            where = exc.filename or directory
            raise OutputPathError(f"{what} {path}: cannot be written ({exc.strerror}: {where})") from None
        if path.is_file() and not os.access(path, os.W_OK):
            raise OutputPathError(f"{what} {path}: the file exists and is not writable")
