"""The config a `--configfile` list resolves to, for tests that read presets (no Snakemake run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agentrl.config import Config, load_config
from helpers.workflows import ROOT, merged

PRESETS = ROOT / "presets"
PAPER = PRESETS / "paper-qwen3-4b.yaml"
AS_RELEASED = PRESETS / "paper-as-released.yaml"


def resolved(*presets: Path | str, overrides: dict[str, Any] | None = None) -> Config:
    """config.yaml, then each preset (a path, or a file name under presets/), then ``overrides``, as
    Snakemake merges them."""
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    for preset in presets:
        raw = merged(raw, yaml.safe_load((PRESETS / preset).read_text()))
    return load_config(merged(raw, overrides or {}), origin=" + ".join(Path(p).name for p in presets))
