"""Which eval sets the grpo job validates on (``grpo.validation.benchmarks``), read from the shell
command of a dry run: the paper preset passes AIME24/25 only (as upstream), the embedded default
every set, and an unknown name stops the workflow at load naming the key."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # each dry run builds the DAG (several seconds)

ROOT = Path(__file__).resolve().parents[1]


def _grpo_eval_sets(workdir: Path, *configfiles: Path) -> tuple[list[str] | None, str]:
    workdir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "snakemake", "-n", "-p", "--cores", "2", "--until", "grpo"]
    command += ["-s", str(ROOT / "workflow" / "Snakefile"), "--directory", str(workdir)]
    command += ["--configfile", str(ROOT / "config.yaml"), *map(str, configfiles)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=workdir, env=env)
    output = done.stdout + done.stderr
    line = next((x for x in output.splitlines() if "agentrl grpo" in x), None)
    if line is None:
        return None, output
    passed = re.search(r"--eval (.*?) --out", line).group(1).split()
    return [Path(p).stem for p in passed], output


def test_the_paper_preset_validates_on_aime_only_and_the_default_on_every_set(tmp_path):
    paper, output = _grpo_eval_sets(tmp_path / "paper", ROOT / "presets" / "paper-qwen3-4b.yaml")
    assert paper == ["aime2024", "aime2025"], output[-3000:]
    embedded, output = _grpo_eval_sets(tmp_path / "default")
    families = yaml.safe_load((ROOT / "config.yaml").read_text())["data"]["embedded"]["families"]
    assert embedded == list(families), output[-3000:]

    chosen = tmp_path / "chosen.yaml"
    chosen.write_text(yaml.safe_dump({"grpo": {"validation": {"benchmarks": [families[1]]}}}))
    assert _grpo_eval_sets(tmp_path / "chosen", chosen)[0] == [families[1]]
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump({"grpo": {"validation": {"benchmarks": ["aime2024"]}}}))
    passed, output = _grpo_eval_sets(tmp_path / "unknown", unknown)
    assert passed is None and "grpo.validation.benchmarks names aime2024" in output, output[-3000:]
