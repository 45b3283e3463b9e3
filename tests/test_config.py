"""Config: one schema, defaults filled, unknown keys and wrong types refused with the key named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl.config import ConfigError, load_config, load_config_file, load_schema

ROOT = Path(__file__).resolve().parents[1]


def _schema_keys(schema: dict, prefix: str = "") -> set[str]:
    keys = set()
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        keys.add(path)
        if sub.get("type") == "object" and "properties" in sub:
            keys |= _schema_keys(sub, f"{path}.")
    return keys


def _yaml_keys(mapping: dict, prefix: str = "") -> set[str]:
    keys = set()
    for name, value in mapping.items():
        path = f"{prefix}{name}"
        keys.add(path)
        if isinstance(value, dict) and path not in ("data.upstream.eval",):
            keys |= _yaml_keys(value, f"{path}.")
    return keys


def test_embedded_default_lists_every_schema_key_and_loads():
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    schema_keys = _schema_keys(load_schema())
    yaml_keys = {k for k in _yaml_keys(raw) if not k.startswith(("data.upstream.sft.", "data.upstream.rl."))}
    assert schema_keys - yaml_keys == set(), "config.yaml must list every key of the schema"
    cfg = load_config_file(ROOT / "config.yaml")
    assert cfg.data.source == "embedded"
    assert cfg.data.benchmarks == ("arith", "choice", "program")


def test_every_config_yaml_key_is_commented():
    """Each key of config.yaml has its comment on its own line; entries of a mapping or list whose
    header's comment says what its entries are (benchmark sources, ablation questions) share it."""
    lines = (ROOT / "config.yaml").read_text().splitlines()
    headers: list[tuple[int, bool]] = []  # (indent, commented) of the blocks the line is inside
    uncommented = []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        while headers and headers[-1][0] >= indent:
            headers.pop()
        commented = "#" in line
        is_entry = stripped.split(":", 1)[1].strip().startswith(("{", "[")) if ":" in stripped else False
        if not commented and not (is_entry and headers and headers[-1][1]):
            uncommented.append(f"line {number}: {stripped}")
        if stripped.endswith(":") or (commented and line.split("#", 1)[0].rstrip().endswith(":")):
            headers.append((indent, commented))
    assert uncommented == [], "config.yaml keys without a comment:\n" + "\n".join(uncommented)


def test_defaults_fill_a_partial_config():
    cfg = load_config({"sandbox": {"workers": 2}})
    assert cfg.sandbox.workers == 2
    assert cfg.sandbox.timeout_s == 10.0 and isinstance(cfg.sandbox.timeout_s, float)
    assert cfg.tool.max_output_chars == 256


def test_unknown_key_is_named_with_the_allowed_ones():
    with pytest.raises(ConfigError) as err:
        load_config({"rollout": {"engin": "hf"}})
    assert "unknown key(s) ['engin'] under 'rollout'" in str(err.value)
    assert "'engine'" in str(err.value)


def test_wrong_type_and_bad_enum_are_named():
    with pytest.raises(
        ConfigError, match=r"'sandbox.workers' = 'four' has the wrong type; expected \['integer', 'null'\]"
    ):
        load_config({"sandbox": {"workers": "four"}})
    with pytest.raises(
        ConfigError, match=r"'rollout.engine' = 'sglang' is not allowed; choose one of \['hf', 'vllm'\]"
    ):
        load_config({"rollout": {"engine": "sglang"}})


def test_config_is_frozen():
    cfg = load_config({})
    with pytest.raises(AttributeError):
        cfg.seed = 3  # type: ignore[misc]


def test_bad_yaml_file_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("seed: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config_file(path)


def test_the_config_layer_imports_no_stage_package():
    """Every stage builds on the config; the config builds on none of them (a check that needs a
    stage's facts lives beside the stage)."""
    stages = ("grpo", "sft", "filtering", "evaluation", "report", "rollout", "tools", "rewards", "data")
    code = (
        "import sys, agentrl.config, agentrl.config.workflow_check; "
        "print(' '.join(m for m in sys.modules if m.startswith('agentrl.')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert not [m for m in loaded if m.split(".")[1] in stages], loaded
