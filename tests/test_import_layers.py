"""The import layers of pyproject.toml's [tool.importlinter] hold (docs/design.md, "Layers").

``lint-imports`` (import-linter) reads every module of ``src/agentrl`` with function-level
imports included; a module that imports from a higher layer, or a stage that imports another
stage, breaks the contract and the test prints which line does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(src: Path, config: Path) -> subprocess.CompletedProcess:
    linter = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    if linter is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[test]' brings import-linter")
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [linter, "--config", str(config), "--no-cache"], cwd=src, env=env, capture_output=True, text=True
    )


def test_the_import_layers_point_down():
    result = lint_imports(ROOT / "src", ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The contract is not vacuous: the bottom layer importing a stage is reported, with its line."""
    shutil.copytree(ROOT / "src" / "agentrl", tmp_path / "agentrl", ignore=shutil.ignore_patterns("__pycache__"))
    errors = tmp_path / "agentrl" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _stage():\n    from agentrl.grpo import variants\n")
    result = lint_imports(tmp_path, ROOT / "pyproject.toml")
    assert result.returncode != 0
    assert "agentrl.errors is not allowed to import agentrl.grpo" in result.stdout
    assert "agentrl.errors -> agentrl.grpo.variants" in result.stdout
