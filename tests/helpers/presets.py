"""The config a `--configfile` list resolves to, for tests that read presets (no Snakemake run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agentrl.config import Config, load_config

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "presets"
PAPER = PRESETS / "paper-qwen3-4b.yaml"
AS_RELEASED = PRESETS / "paper-as-released.yaml"


def merged(base: dict, overlay: dict) -> dict:
    out = dict(base)
    for key, value in overlay.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def resolved(*presets: Path | str, overrides: dict[str, Any] | None = None) -> Config:
    """config.yaml, then each preset (a path, or a file name under presets/), then ``overrides``, as
    Snakemake merges them."""
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    for preset in presets:
        raw = merged(raw, yaml.safe_load((PRESETS / preset).read_text()))
    return load_config(merged(raw, overrides or {}), origin=" + ".join(Path(p).name for p in presets))
