"""The documented installs resolve on PyPI, for each Python the project supports.

Each install of docs/paper-scale.md ("Installing on a GPU machine or cluster") is a set of
requirements: pyproject's dependencies and the extras the command names, or a conda env's pip
list (envs/*.yaml, used with --sdm conda). ``pip install --dry-run --ignore-installed --report``
resolves each set against the package index for Python 3.11 and 3.12 (``--python-version``,
wheels only, into a throwaway target), so nothing is installed and a pin that cannot be resolved
beside the others fails here, before a user meets it. torch must stay in 2.13.

Slow tier: a resolution reads the index for a minute or more. Skipped, with the reason, only when
no package index answers (no network)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PYTHONS = ["3.11", "3.12"]
# Distributions the index has no wheel of: built here into pure-Python wheels (see resolve)
SOURCE_ONLY = {"deepspeed", "connection-pool", "connection_pool"}


def project_requirements(*extras: str) -> list[str]:
    """``pip install -e ".[extras]"``: the dependencies and the extras' requirements."""
    return list(PROJECT["dependencies"]) + [r for extra in extras for r in PROJECT["optional-dependencies"][extra]]


def env_requirements(name: str) -> list[str]:
    env = yaml.safe_load((ROOT / "envs" / f"{name}.yaml").read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)


def env_python(name: str) -> str:
    env = yaml.safe_load((ROOT / "envs" / f"{name}.yaml").read_text())
    return next(d.split("=", 1)[1] for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))


# The documented installs (docs/paper-scale.md), with the Pythons each is resolved for: what
# snakemake runs in on a SLURM cluster (the jobs' stages then run in the per-rule envs, --sdm
# conda), one GPU workstation, and each per-rule env at the Python it pins.
ENVS = ("data", "train", "vllm", "report")
INSTALLS = {
    "controller: pip install -e .[slurm]": (project_requirements("slurm"), PYTHONS),
    "workstation: pip install -e .[vllm-cuda]": (project_requirements("vllm-cuda"), PYTHONS),
    **{f"--sdm conda: envs/{name}.yaml": (env_requirements(name), [env_python(name)]) for name in ENVS},
}
CASES = [(install, python) for install, (_, pythons) in sorted(INSTALLS.items()) for python in pythons]


def resolve(
    requirements: list[str], python: str, tmp_path: Path, wheels: Path
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``pip install --dry-run`` of ``requirements`` for Python ``python``; the pip run and the
    wheels built from source distributions on the way.

    Wheels only (``--python-version`` needs it): a requirement the index has only a source
    distribution of (DeepSpeed, Snakemake's connection_pool) is built into a wheel in ``wheels``
    (shared by the cases: a build takes a minute) and offered with ``--find-links``, then the
    resolution runs again. Such a wheel must be pure Python (``py3-none-any``), which installs on
    any Python, as the source distribution would.
    """
    built: list[str] = []
    while True:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
             "--report", str(tmp_path / "report.json"), "--python-version", python, "--only-binary=:all:",
             "--find-links", str(wheels), "--target", str(tmp_path / "target"), *requirements],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        missing = re.search(r"Could not find a version that satisfies the requirement (\S+)", done.stderr)
        if done.returncode == 0 or missing is None or missing[1] in built:
            return done, built
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(wheels), missing[1]],
            capture_output=True, text=True, timeout=1800, check=True,
        )  # fmt: skip
        name = Requirement(missing[1]).name.lower().replace("-", "_")
        made = [w.name for w in wheels.glob("*.whl") if w.name.lower().startswith(name)]
        assert made and all(w.endswith("-py3-none-any.whl") for w in made), f"{missing[1]}: built {made}"
        built.append(missing[1])


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("wheels")


@pytest.fixture(scope="module")
def index_answers() -> None:
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "pyyaml"], capture_output=True, text=True, timeout=120
    )
    if probe.returncode != 0:
        pytest.skip(f"no package index answers (pip index versions pyyaml: {probe.stderr.strip()[-300:]})")


@pytest.mark.slow
@pytest.mark.timeout(3600)  # each resolution reads the index for minutes on a loaded machine
@pytest.mark.parametrize(("install", "python"), CASES)
def test_the_documented_install_resolves(index_answers, wheels, install, python, tmp_path):
    done, built = resolve(INSTALLS[install][0], python, tmp_path, wheels)
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
    assert done.returncode == 0, f"{install} on Python {python} does not resolve:\n" + "\n".join(errors)
    assert {Requirement(spec).name.lower() for spec in built} <= SOURCE_ONLY, f"{install}: built {built}"
    chosen = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads((tmp_path / "report.json").read_text())["install"]
    }
    if any(r.startswith("torch") for r in INSTALLS[install][0]):
        assert chosen["torch"].startswith("2.13"), f"{install}: torch {chosen['torch']}"
