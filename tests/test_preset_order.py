"""Overlays name the preset they sit on (``presets: {<name>: [<base>]}``), and the workflow refuses
at load an overlay alone or before its base, naming the overlay's file; the README's order loads."""

from __future__ import annotations

import os

import pytest
import yaml
from helpers.presets import PRESETS
from helpers.workflows import ROOT, merged, run_snakemake

from agentrl.config import ConfigError, check_workflow_config, config_sources

CONFIG = ROOT / "config.yaml"
OVERLAYS = ["paper-as-released", "paper-eval-released", "paper-rl-from-released-sft", "paper-qwen2.5-7b", "rehearsal"]


def _check(*files):
    """check_workflow_config on ``files`` merged as Snakemake merges them, with their sources."""
    config: dict = {}
    for path in files:
        config = merged(config, yaml.safe_load(path.read_text()))
    return check_workflow_config(config, config_sources(list(files), {}))


def test_every_preset_declares_its_name_and_the_overlays_the_paper_preset():
    """The bases of the embedded default (smoke, lora) and of the paper preset declare no other preset."""
    for path in sorted(PRESETS.rglob("*.yaml")):
        name = str(path.relative_to(PRESETS).with_suffix(""))
        declared = yaml.safe_load(path.read_text())["presets"]
        bases = [] if name in ("paper-qwen3-4b", "smoke", "lora") else ["paper-qwen3-4b"]
        assert declared == {name: bases}, path


@pytest.mark.parametrize("overlay", OVERLAYS + ["ablations/grpo_t", "ablations/dynamic_sampling"])
def test_an_overlay_alone_is_refused_naming_its_file(overlay):
    path = PRESETS / f"{overlay}.yaml"
    with pytest.raises(ConfigError) as refused:
        _check(CONFIG, path)
    path = os.path.relpath(path)  # as the workflow names a file under the working folder
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: the preset {overlay} is an overlay on paper-qwen3-4b"), message
    assert "not among the config files" in message
    assert message.endswith(f"--configfile presets/paper-qwen3-4b.yaml {path}"), message


def test_an_overlay_before_its_base_is_refused_naming_both_files():
    overlay, paper = PRESETS / "paper-as-released.yaml", PRESETS / "paper-qwen3-4b.yaml"
    with pytest.raises(ConfigError) as refused:
        _check(CONFIG, overlay, paper)
    overlay, paper = os.path.relpath(overlay), os.path.relpath(paper)
    assert str(refused.value).startswith(f"{overlay}: the preset paper-as-released is an overlay on paper-qwen3-4b")
    assert f"but it comes after it ({paper}); run with --configfile presets/paper-qwen3-4b.yaml {overlay}" in str(
        refused.value
    )


@pytest.mark.parametrize("overlay", OVERLAYS + ["ablations/grpo"])
def test_the_documented_order_loads(overlay):
    cfg = _check(CONFIG, PRESETS / "paper-qwen3-4b.yaml", PRESETS / f"{overlay}.yaml")
    assert cfg.model.base or cfg.data.source  # built: every check passed


def test_one_file_merged_from_a_preset_and_its_overlay_loads(tmp_path):
    """A config written from several presets holds them all: its overlay's base is in the same file."""
    config = {}
    for name in ("paper-qwen3-4b", "paper-eval-released"):
        config = merged(config, yaml.safe_load((PRESETS / f"{name}.yaml").read_text()))
    path = tmp_path / "combined.yaml"
    path.write_text(yaml.safe_dump(config))  # sorted keys: the overlay is listed before its base
    _check(CONFIG, path)


@pytest.mark.timeout(300)
def test_snakemake_refuses_an_overlay_alone_at_load(tmp_path):
    (tmp_path / "config.yaml").write_text(CONFIG.read_text())
    overlay = PRESETS / "paper-rl-from-released-sft.yaml"
    done = run_snakemake(tmp_path, "-n", "--configfile", str(overlay), timeout=240)
    assert done.returncode != 0
    assert f"{overlay}: the preset paper-rl-from-released-sft is an overlay on paper-qwen3-4b" in done.stderr, (
        done.stderr[-3000:]
    )
