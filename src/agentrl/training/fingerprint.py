"""Run fingerprints: what a checkpoint must share with a run to be resumed by it (SFT and GRPO).

A fingerprint is a JSON object compared by ``==`` (differences named by
:func:`agentrl.training.deepspeed_engine.fingerprint_differences`): the config sections that
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
