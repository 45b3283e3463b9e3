"""What the Snakefile runs when it loads: the config's sources, in Snakemake's merge order, and
the check of the merged config (validation, defaults, cross-key checks, model folders) whose
errors name the file each bad key came from."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.config.checks import check_cross_keys
from agentrl.config.loading import fill_derived_defaults, load_config, read_config_yaml, validate_and_fill
from agentrl.config.sections import Config, ConfigError


def config_sources(configfiles: list[str | Path], overrides: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Where the workflow's config came from, in the order Snakemake merged it: files, then ``--config``."""
    sources = []
    for path in map(Path, configfiles):
        name = os.path.relpath(path) if path.is_absolute() and path.is_relative_to(Path.cwd()) else str(path)
        sources.append((name, read_config_yaml(path) or {}))  # Snakemake's own read drops a key given twice
    if overrides:
        sources.append(("--config", dict(overrides)))
    return sources


def _source_of(sources: list[tuple[str, dict[str, Any]]]) -> Callable[[tuple[str, ...]], str]:
    """A function naming the last source that set a key path (or its nearest parent), else the schema."""

    def holds(mapping: Any, path: tuple[str, ...]) -> bool:
        for part in path:
            if not isinstance(mapping, dict) or part not in mapping:
                return False
            mapping = mapping[part]
        return True

    def source_of(path: tuple[str, ...]) -> str:
        for length in range(len(path), 0, -1):
            for name, mapping in reversed(sources):
                if holds(mapping, path[:length]):
                    return name
        return "schema default"

    return source_of


def check_workflow_config(config: dict[str, Any], sources: list[tuple[str, dict[str, Any]]]) -> Config:
    """What the Snakefile runs at load: coerce and validate ``config`` in place (defaults filled),
    then build it as every stage does, so the cross-key checks of :func:`load_config` run before
    any job. Errors name the source of each bad key (``config_sources``)."""
    origin = "config (" + " + ".join(name for name, _ in sources) + ")" if sources else "config"
    fill_derived_defaults(validate_and_fill(config, origin, _source_of(sources)))
    check_preset_order(sources or [("config", config)])
    cfg = load_config(config, origin)
    check_cross_keys(cfg, origin)
    check_results_dir(cfg.results_dir, _source_of(sources)(("results_dir",)))
    check_model_sources(cfg)
    return cfg


def check_results_dir(results_dir: str, source: str) -> None:
    """Every output is under ``results_dir``: a file at that path or at one of its parents fails
    only when Snakemake makes the first output's folder (``NotADirectoryError``, no key named).
    Raises ConfigError naming the key, its source and the file in the way."""
    for path in (Path(results_dir), *Path(results_dir).parents):
        if path.exists() and not path.is_dir():
            where = "is a file" if path == Path(results_dir) else f"is under {path}, which is a file"
            raise ConfigError(
                f"{source}: results_dir={results_dir!r} {where}, not a folder: every output goes under it; "
                "name another folder or move the file"
            )


def check_preset_order(sources: list[tuple[str, dict[str, Any]]]) -> None:
    """Each preset file declares ``presets: {<its name>: [<presets it needs before it>]}``; an
    overlay's needs must be declared by an earlier source or by the same one (a file merged from
    several presets holds them all). Else the overlay runs as something other than what it says
    (alone, a released-model overlay evaluates the embedded tasks; before the paper preset, the
    paper preset's values override it). Raises a one-line ConfigError naming the overlay's file,
    what it needs and the order that works (``--configfile presets/<name>.yaml``: a preset's
    name is its path under presets/)."""
    declared = [(name, mapping.get("presets") if isinstance(mapping, dict) else None) for name, mapping in sources]
    declared = [(name, entries if isinstance(entries, dict) else {}) for name, entries in declared]
    loaded: set[str] = set()
    for position, (where, entries) in enumerate(declared):
        available = loaded | set(entries)
        for preset, needs in entries.items():
            missing = [need for need in needs or [] if need not in available]
            if not missing:
                continue
            order = " ".join(f"presets/{need}.yaml" for need in needs)
            later = [name for name, found in declared[position + 1 :] if missing[0] in found]
            problem = f"it comes after it ({later[0]})" if later else "it is not among the config files"
            raise ConfigError(
                f"{where}: the preset {preset} is an overlay on {', '.join(missing)}, which must be loaded before it, "
                f"but {problem}; run with --configfile {order} {where}"
            )
        loaded |= set(entries)


def check_model_sources(cfg: Config) -> None:
    """``model.base``, ``sft.from`` and each ``eval.checkpoints`` entry that names an existing folder
    must be a model folder (config.json, weights matching it, a tokenizer with a chat template): else
    the link, the training or the evaluation fails hours later. A hub id or a folder still to be
    made is left to its rule. Raises ModelFolderError."""
    from agentrl.model.folder import check_model_folder  # lazy: the folder module is not needed to load a config

    sources = [("model.base", cfg.model.base), ("sft.from", cfg.sft.from_ and cfg.sft.from_.id)]
    sources += [(f"eval.checkpoints.{k}", v.id) for k, v in cfg.eval.checkpoints.items()]
    for key, name in sources:
        if name is not None and name != "embedded" and Path(name).expanduser().is_dir():
            check_model_folder(Path(name).expanduser(), key)
