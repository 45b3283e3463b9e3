"""Which names of a model or data source are mistyped local paths rather than hub ids.

A hub repository is named ``owner/name``. A source that exists on this machine is read from
there; one that does not is looked up on the hub, so a typo in a local path (``./models/qwen``,
``/data/x``, ``results/model/sft`` where ``results/`` exists) would otherwise become a download
attempt that fails minutes later with the hub's own error, or downloads something else.

A hub id that cannot be fetched (:func:`hub_fetch_refusal`) is the user's to fix too: not in the
local cache while the hub is offline or unreachable, or not on the hub as spelled. The hub client
raises its own error (``LocalEntryNotFoundError``, ``RepositoryNotFoundError``, a raw
``ConnectError``), which names neither the config key nor what to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from agentrl.errors import HubSourceError, UserInputError

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


# The HTTP clients huggingface_hub has used: a transport error of theirs (no connection, a timeout)
# escapes some of its calls unwrapped.
_HTTP_CLIENT_MODULES = ("httpx", "httpx2", "requests", "urllib3")


def hub_fetch_refusal(
    exc: BaseException, key: str, repo_id: str, revision: str | None, file: str | None = None
) -> HubSourceError | None:
    """The one-line error for ``exc``, raised while fetching ``repo_id`` (``file`` in it) at
    ``revision`` for the config key ``key``, or None when ``exc`` is no fetch failure (a bug).

    The line names the key, the id, the revision (and the file) and what to do: fill the cache
    where the network is (``hub-download``), unset ``HF_HUB_OFFLINE``, check the spelling, or log
    in for a private or gated repository.
    """
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"{key}={repo_id!r}" + (f" at revision {revision!r}" if revision else "")  # none: the default branch
    what += f", file {file!r}" if file else ""
    spelling = "check the id's spelling"
    if isinstance(exc, (LocalEntryNotFoundError, OfflineModeIsEnabled)) or _is_transport_error(exc):
        hub = "the hub is not asked (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else "the hub cannot be reached"
        return HubSourceError(
            f"{what}: not in the local hub cache ({constants.HF_HUB_CACHE}) and {hub}; fill the cache where the "
            "network is (python -m agentrl hub-download, the hub_download rule, with the same HF_HOME or "
            f"HF_HUB_CACHE) or, with a network here, unset HF_HUB_OFFLINE; {spelling}"
        )
    if isinstance(exc, GatedRepoError):
        return HubSourceError(
            f"{what}: a gated repository; accept its terms on its hub page and log in (hf auth login or HF_TOKEN)"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return HubSourceError(f"{what}: the hub has no such repository; {spelling} (a private one needs HF_TOKEN)")
    if isinstance(exc, RevisionNotFoundError):
        return HubSourceError(f"{what}: the repository has no such branch, tag or commit; check the revision")
    if isinstance(exc, RemoteEntryNotFoundError):
        return HubSourceError(f"{what}: the repository has no such file at that revision; check the file name")
    if isinstance(exc, HFValidationError):
        return HubSourceError(f"{what}: not a valid hub id ({str(exc).splitlines()[0]}); {spelling}")
    if isinstance(exc, HfHubHTTPError):
        return HubSourceError(f"{what}: the hub refused it ({str(exc).splitlines()[0]})")
    return None


@contextmanager
def fetching(key: str, repo_id: str, revision: str | None, file: str | None = None) -> Iterator[None]:
    """Raise :func:`hub_fetch_refusal`'s one line for a hub fetch that fails in the block."""
    try:
        yield
    except Exception as exc:
        refusal = hub_fetch_refusal(exc, key, repo_id, revision, file)
        if refusal is None:
            raise
        raise refusal from exc


def _is_transport_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in _HTTP_CLIENT_MODULES and not isinstance(exc, UserInputError)
