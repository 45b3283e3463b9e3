"""Run fingerprints: what a checkpoint must share with a run to be resumed by it (SFT and GRPO).

A fingerprint is a JSON object compared by ``==`` (differences named by
:func:`fingerprint_differences`): the config sections that
shape training, less the keys that only change where or how fast it runs; the seed; the process
count; the input files by content (streamed SHA-256); the initial model's files by size and
mtime (hashing a 4B model's weights on every start costs more than it protects; a retrained
model is a new folder with new mtimes).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_files(folder: str | Path) -> dict[str, list[int]]:
    """``{file name: [size, mtime_ns]}`` of every file in a model folder."""
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(Path(folder).iterdir()) if p.is_file()}


def without_keys(sections: Mapping[str, Any], left_out: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """A deep copy of ``sections`` less ``left_out`` (dotted section path -> keys)."""
    kept = copy.deepcopy(dict(sections))
    for dotted, keys in left_out.items():
        section = kept
        for part in dotted.split("."):
            section = section[part]
        for key in keys:
            section.pop(key)
    return kept


def fingerprint_of(
    settings: Mapping[str, Any],
    *,
    seed: int,
    world_size: int,
    model_dir: str | Path,
    files: Mapping[str, str | Path | Mapping[str, str | Path]],
) -> dict[str, Any]:
    """``settings`` (config sections as dicts) with the seed, the process count, the model's
    files and ``<name>_sha256`` of each input in ``files`` (a path, or ``{label: path}``)."""
    digests = {
        f"{name}_sha256": (
            {label: file_sha256(p) for label, p in path.items()} if isinstance(path, Mapping) else file_sha256(path)
        )
        for name, path in files.items()
    }
    fingerprint = {
        **settings,
        "seed": seed,
        "world_size": world_size,
        "model_files": model_files(model_dir),
        **digests,
    }
    return json.loads(json.dumps(fingerprint))  # tuples as lists: equal to what a checkpoint reads back


MAX_NAMED_DIFFERENCES = 8
# Fingerprint keys in which a retry differs by accident (another GPU count for the same job): such
# a checkpoint is refused and kept, never set aside for a silent restart.
ACCIDENTAL_DIFFERENCES = frozenset({"world_size"})


def fingerprint_differences(saved: Any, current: Any, prefix: str = "") -> list[str]:
    """The dotted keys at which two run fingerprints differ (``[]``: the same run setup).

    Nested mappings are compared key by key, so a changed ``grpo.lr`` reads as ``grpo.lr`` rather
    than ``grpo``; any other value is compared whole.
    """
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        differences: list[str] = []
        for key in sorted(set(saved) | set(current), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in saved or key not in current:
                differences.append(name)
            else:
                differences += fingerprint_differences(saved[key], current[key], name)
        return differences
    return [] if saved == current else [prefix or "(fingerprint)"]


def differences_from(state: Mapping[str, Any], fingerprint: Mapping[str, Any]) -> list[str]:
    """The keys in which the checkpoint with trainer state ``state`` differs from ``fingerprint``."""
    saved = state.get("fingerprint")
    if saved is None:
        return ["(no run fingerprint: written before checkpoints stored one)"]
    return fingerprint_differences(saved, fingerprint)


def describe_differences(differences: list[str]) -> str:
    named = ", ".join(differences[:MAX_NAMED_DIFFERENCES])
    more = len(differences) - MAX_NAMED_DIFFERENCES
    return f"its run setup differs in {named}" + (f" and {more} more" if more > 0 else "")
