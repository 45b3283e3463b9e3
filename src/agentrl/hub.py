"""Hugging Face hub downloads: pinned revisions, one download step, offline reads after it.

A hub source is named by an id and a ``revision`` (a commit hash, a tag or a branch; null =
the default branch, ``main``). The data sources are ``{id, file, revision}``
(``data.upstream.*``), the base model is ``model.base`` + ``model.revision``; a commit hash pins
exactly what is read, so a later push to the hub repository changes nothing.

Every read goes through the local hub cache (``HF_HOME`` / ``HF_HUB_CACHE``):
:func:`dataset_file` and :func:`model_snapshot` return paths inside it, downloading what is
missing unless the hub is offline (``HF_HUB_OFFLINE=1``), in which case a file not in the cache
is an error naming it. The workflow's ``hub_download`` rule (``python -m agentrl hub-download``,
:mod:`agentrl.hub_cli`)
fills the cache on the submitting host, where the network is; the rules that read the data and
the model then run with ``HF_HUB_OFFLINE=1`` wherever the scheduler puts them, so the cache must
be on a file system the compute nodes see (docs/paper-scale.md).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

from agentrl.config import Config, SourceConfig
from agentrl.errors import HubSourceError
from agentrl.hub_ids import fetching, refuse_path_typos

log = logging.getLogger("agentrl.hub")
LOCAL_DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
COMMIT_HASH = re.compile(r"^[0-9a-f]{40}$")


def is_hub_id(name: str) -> bool:
    """``org/name`` that is not an existing local path: what the hub resolves."""
    if Path(name).expanduser().exists() or name.endswith(LOCAL_DATA_SUFFIXES):
        return False
    return name.count("/") == 1 and not name.startswith((".", "/", "~"))


def dataset_file(source: SourceConfig, key: str = "data source") -> Path:
    """The local path of ``source.file`` of the hub dataset ``source.id`` at ``source.revision``;
    one that cannot be fetched raises HubSourceError naming ``key`` (its config key)."""
    from huggingface_hub import hf_hub_download

    if not source.file:
        raise HubSourceError(f"{key}: {source.id!r} is a hub dataset and needs 'file' (the file inside it)")
    with fetching(key, source.id, source.revision, source.file):
        return Path(hf_hub_download(source.id, source.file, repo_type="dataset", revision=source.revision))


def model_snapshot(repo_id: str, revision: str | None, key: str = "model.base") -> Path:
    """The local folder holding the hub model ``repo_id`` at ``revision``; errors as :func:`dataset_file`."""
    from huggingface_hub import snapshot_download

    with fetching(key, repo_id, revision):
        return Path(snapshot_download(repo_id, revision=revision))


def hub_dataset_sources(cfg: Config) -> Iterator[tuple[str, SourceConfig]]:
    """(config key, source) of every data source the config reads from the hub."""
    if cfg.data.source != "upstream":
        return
    up = cfg.data.upstream
    named = [("data.upstream.sft", up.sft), ("data.upstream.rl", up.rl)]
    named += [(f"data.upstream.eval.{name}", source) for name, source in up.eval.items()]
    for key, source in named:
        if is_hub_id(source.id):
            yield key, source


def named_sources(cfg: Config) -> Iterator[tuple[str, str]]:
    """(config key, name) of the model and data sources the config names as a hub id or a local path.

    Not ``eval.checkpoints``: a plain string there is always a local folder (its rule's input), and
    ``fetch-model`` checks the ``{id, revision}`` ones it resolves.
    """
    if cfg.model.base != "embedded":
        yield "model.base", cfg.model.base
    if cfg.sft.from_ is not None:
        yield "sft.from", cfg.sft.from_.id
    if cfg.data.source == "upstream":
        up = cfg.data.upstream
        yield from (("data.upstream.sft.id", up.sft.id), ("data.upstream.rl.id", up.rl.id))
        yield from ((f"data.upstream.eval.{name}.id", source.id) for name, source in up.eval.items())


def check_sources(cfg: Config) -> None:
    """Refuse a source that is a mistyped local path (:func:`agentrl.hub_ids.path_typo`), naming its
    key: before any download, at workflow load and at the start of each stage that resolves one."""
    refuse_path_typos(named_sources(cfg))


def needs_hub(cfg: Config) -> bool:
    return any(True for _ in hub_dataset_sources(cfg)) or is_hub_id(cfg.model.base)


def _snapshot_commit(path: Path) -> str | None:
    """The commit a hub-cache path belongs to (``.../snapshots/<commit>/...``)."""
    parts = path.parts
    if "snapshots" in parts and parts.index("snapshots") + 1 < len(parts):
        return parts[parts.index("snapshots") + 1]
    return None


def _pin_note(key: str, revision: str | None, commit: str | None) -> None:
    if revision is None or not COMMIT_HASH.match(revision):
        log.warning("%s is not pinned to a commit (revision %r); it resolved to %s", key, revision, commit)


def download(cfg: Config) -> dict[str, dict[str, str | None]]:
    """Fetch every hub file and model the config reads into the hub cache; returns the manifest:
    config key -> id, file, revision asked for, commit received."""
    check_sources(cfg)
    manifest: dict[str, dict[str, str | None]] = {}
    for key, source in hub_dataset_sources(cfg):
        path = dataset_file(source, key)
        commit = _snapshot_commit(path)
        _pin_note(key + ".revision", source.revision, commit)
        manifest[key] = {"id": source.id, "file": source.file, "revision": source.revision, "commit": commit}
        log.info("%s: %s/%s at %s", key, source.id, source.file, commit)
    if is_hub_id(cfg.model.base):
        folder = model_snapshot(cfg.model.base, cfg.model.revision)
        commit = _snapshot_commit(folder)
        _pin_note("model.revision", cfg.model.revision, commit)
        manifest["model.base"] = {"id": cfg.model.base, "file": None, "revision": cfg.model.revision, "commit": commit}
        log.info("model.base: %s at %s", cfg.model.base, commit)
    return manifest
