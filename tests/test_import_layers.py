"""The import contracts of pyproject.toml's [tool.importlinter] hold (docs/design.md, "Layers").

``lint-imports`` (import-linter) reads every module of ``src/agentrl`` with function-level
imports included: a module that imports from a higher layer, or a stage that imports another
stage, breaks the layers; a rollout module that the weight path (``rollout/weight_transfer.py``)
imports breaks the weight path's layers; an import loop among the modules of one package breaks
the acyclic contract. The test prints which line does.
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
    env = {**os.environ, "PYTHONPATH": str(src), "COLUMNS": "200"}  # its report unwrapped, one line per import
    return subprocess.run(
        [linter, "--config", str(config), "--no-cache"], cwd=src, env=env, capture_output=True, text=True
    )


def test_the_import_layers_point_down():
    result = lint_imports(ROOT / "src", ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The contract is not vacuous: the bottom layer importing a stage is reported, with its line."""
    shutil.copytree(ROOT / "src" / "agentrl", tmp_path / "agentrl", ignore=shutil.ignore_patterns("__pycache__"))
    errors = tmp_path / "agentrl" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _stage():\n    from agentrl.grpo import variants\n")
    result = lint_imports(tmp_path, ROOT / "pyproject.toml")
    assert result.returncode != 0
    assert "agentrl.errors is not allowed to import agentrl.grpo" in result.stdout
    assert "agentrl.errors -> agentrl.grpo.variants" in result.stdout


def _copy_with(tmp_path: Path, module: str, appended: str) -> Path:
    """A copy of the package with ``appended`` at the end of ``module`` (a path under agentrl/)."""
    shutil.copytree(ROOT / "src" / "agentrl", tmp_path / "agentrl", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "agentrl" / module
    target.write_text(target.read_text() + appended)
    return tmp_path


def test_the_weight_path_importing_an_engine_breaks_its_contract(tmp_path):
    """The loop rollout/weight_transfer.py once closed (its trainer end importing vLLM's side, which
    imported the vLLM engine) is reported, with the function-level import's line."""
    src = _copy_with(
        tmp_path, "rollout/weight_transfer.py", "\n\ndef _engine():\n    from agentrl.rollout import vllm_engine\n"
    )
    result = lint_imports(src, ROOT / "pyproject.toml")
    assert result.returncode != 0
    assert "agentrl.rollout.weight_transfer is not allowed to import agentrl.rollout.vllm_engine" in result.stdout
    assert "No cycles are allowed in agentrl.rollout" in result.stdout


def test_an_import_loop_in_a_package_breaks_the_acyclic_contract(tmp_path):
    """A loop among modules no layer lists (the agent loop and its context bound) is still reported."""
    src = _copy_with(tmp_path, "rollout/context.py", "\n\ndef _loop():\n    from agentrl.rollout import agent_loop\n")
    result = lint_imports(src, ROOT / "pyproject.toml")
    assert result.returncode != 0
    assert "No cycles are allowed in agentrl.rollout" in result.stdout
    assert "2 kept, 1 broken" in result.stdout
