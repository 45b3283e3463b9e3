"""Which names of a model or data source are mistyped local paths rather than hub ids.

A hub repository is named ``owner/name``. A source that exists on this machine is read from
there; one that does not is looked up on the hub, so a typo in a local path (``./models/qwen``,
``/data/x``, ``results/model/sft`` where ``results/`` exists) would otherwise become a download
attempt that fails minutes later with the hub's own error, or downloads something else.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from agentrl.errors import UserInputError

PATH_PREFIXES = ("/", "./", "../", "~")


def path_typo(name: str) -> str | None:
    """Why ``name`` is probably a mistyped local path, or None when it is no such thing.

    ``name`` exists here: None (a local source). Else it is a path, and nothing is there, when it
    starts with ``/``, ``./``, ``../`` or ``~``, holds more than one ``/``, or is ``first/rest``
    with a folder ``first`` here. Anything else (``owner/name``, or a name without ``/``, which
    the source's reader judges) is None.
    """
    if Path(name).expanduser().exists():
        return None
    if name.startswith(PATH_PREFIXES):
        return "it is spelled as a local path (a hub id is owner/name) and nothing is there"
    if name.count("/") > 1:
        return "a hub id is owner/name, with one '/'; as a local path, nothing is there"
    first = name.split("/", 1)[0]
    if "/" in name and Path(first).expanduser().is_dir():
        return f"the folder {first}/ exists here, so it is read as a local path, and nothing is there"
    return None


def refuse_path_typos(named: Iterable[tuple[str, str]]) -> None:
    """Raise UserInputError naming each config key whose source (key, name) is a :func:`path_typo`."""
    problems = [f"{key}={name!r}: {why}" for key, name in named if (why := path_typo(name)) is not None]
    if problems:
        raise UserInputError(
            "neither a local path that exists nor a hub id (probably a typo):\n  - " + "\n  - ".join(problems)
        )
