"""Starting the repository's Snakemake workflow from tests: config files, commands, runs, listings.

Every workflow test runs snakemake as a real subprocess of this Python, in its own folder, with
this checkout's ``src`` first on PYTHONPATH (so the jobs' ``python -m agentrl`` runs the code
under test) and one OpenMP thread per job (the test machines have few cores).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SNAKEFILE = ROOT / "workflow" / "Snakefile"
# A whole workflow run in minutes on a CPU: a handful of problems, a 2-layer model, one GRPO step.
TINY = {
    "data": {
        "embedded": {
            "families": ["arith", "program"],
            "sft_per_family": 4,
            "rl_pool_per_family": 2,
            "eval_per_family": 2,
        }
    },
    "model": {
        "embedded": {
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 2,
            "num_kv_heads": 1,
            "head_dim": 16,
            "intermediate_size": 64,
            "pretrain": {"conversations": 16},  # two steps of 8
        }
    },
    "sandbox": {"workers": 1},
    "rollout": {"max_response_tokens": 32, "max_turns": 1},
    "reward": {"overlong": {"max_response_length": 32, "buffer_length": 8}},
    "sft": {"epochs": 1},
    # The untrained model solves nothing: keep unsolved problems so GRPO has data.
    "filter": {"k": 1, "low": -1.0},
    "grpo": {
        "max_steps": 1,
        "batch_prompts": 2,
        "n": 2,
        "mini_batch_prompts": 2,
        "test_freq": 0,
        "val_before_train": False,
        "save_freq": 1,
    },
    "eval": {"n": 1, "models": ["base", "sft", "rl"]},
}
# The rules of the default workflow that evaluation depends on, directly or not.
UPSTREAM_OF_EVAL = {
    "prepare_data",
    "base_model",
    "copy_corpus",
    "pretrain",
    "fit_rl_prompts",
    "fit_eval_prompts",
    "sft",
    "score_rl_pool",
    "gather_pass_rates",
    "scoring_config",
    "select_rl_data",
    "grpo",
}
JOB_HEADER = re.compile(r"^(?:local)?rule (\w+):$")


def merged(base: dict, overlay: dict) -> dict:
    """``base`` with ``overlay`` on top, nested mappings merged key by key."""
    out = dict(base)
    for key, value in overlay.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def write_config(workdir: Path, *overlays: dict) -> Path:
    """config.yaml of ``workdir``: the repository's config.yaml with ``overlays`` on top, in order."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    for overlay in overlays:
        config = merged(config, overlay)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def snakemake_command(workdir: Path, *args: str, snakefile: Path = SNAKEFILE, cores: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--cores",
        str(cores),
        "-s",
        str(snakefile),
        "--directory",
        str(workdir),
        *args,
    ]


def snakemake_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def run_snakemake(
    workdir: Path, *args: str, timeout: float = 600, snakefile: Path = SNAKEFILE, cores: int = 2
) -> subprocess.CompletedProcess:
    """One snakemake call in ``workdir``, finished; the caller judges its exit status."""
    return subprocess.run(
        snakemake_command(workdir, *args, snakefile=snakefile, cores=cores),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=workdir,
        env=snakemake_env(),
    )


def snakemake(workdir: Path, *args: str, timeout: float = 600, **options) -> subprocess.CompletedProcess:
    """``run_snakemake``, which must succeed."""
    done = run_snakemake(workdir, *args, timeout=timeout, **options)
    assert done.returncode == 0, f"snakemake {' '.join(args)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    return done


def start_snakemake(workdir: Path, *args: str, snakefile: Path = SNAKEFILE) -> subprocess.Popen:
    """snakemake running in the background in its own session (its process group holds its jobs)."""
    return subprocess.Popen(
        snakemake_command(workdir, *args, snakefile=snakefile),
        cwd=workdir,
        env=snakemake_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_for(predicate, timeout: float, what: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(f"snakemake ended (exit {process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.1)


def job_counts(output: str) -> dict[str, int]:
    """Rule -> jobs of a run's or dry run's "Job stats" table (empty when there is nothing to do)."""
    if "Nothing to be done" in output:
        return {}
    counts = {}
    for line in output.split("Job stats:", 1)[1].splitlines()[3:]:
        match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not match or match.group(1) == "total":
            break
        counts[match.group(1)] = int(match.group(2))
    return counts


def jobs_in_listing(listing: str) -> list[tuple[str, dict[str, str]]]:
    """(rule, wildcards) of every job block of a Snakemake run or dry-run listing, the ``all`` target aside."""
    jobs: list[tuple[str, dict[str, str]]] = []
    for line in listing.splitlines():
        header = JOB_HEADER.match(line)
        if header:
            jobs.append((header[1], {}))
        elif jobs and line.strip().startswith("wildcards:"):
            pairs = line.strip().removeprefix("wildcards:").split(",")
            jobs[-1][1].update(pair.strip().split("=", 1) for pair in pairs)
    return [(rule, wildcards) for rule, wildcards in jobs if rule != "all"]


def shell_commands(listing: str) -> list[str]:
    """The command of every job of a ``snakemake -n -p`` listing (its ``Shell command:`` lines)."""
    return [line.removeprefix("Shell command: ") for line in listing.splitlines() if line.startswith("Shell command: ")]


def stage_config(command: str, workdir: Path) -> dict:
    """The config a job's stage reads: the JSON file its ``--config`` names, relative to ``workdir``
    (the rules pass each job's config as a file, rules/common.smk ``config_params``)."""
    words = shlex.split(command.split(" 2>&1 ", 1)[0])
    return json.loads((workdir / words[words.index("--config") + 1]).read_text())


def planned(workdir: Path, *args: str) -> list[tuple[str, dict[str, str]]]:
    done = snakemake(workdir, "-n", *args, timeout=180)
    return jobs_in_listing(done.stdout + done.stderr)


def rules_of(jobs) -> set[str]:
    return {rule for rule, _ in jobs}


def models_of(jobs, rule: str) -> set[str]:
    return {wildcards["model"] for r, wildcards in jobs if r == rule}


def rules_snakefile(*rule_files: str, extra: str = "") -> str:
    """A Snakefile of part of the workflow: the repository's config.yaml coerced, validated and
    filled as workflow/Snakefile does, rules/common.smk, then ``rule_files`` (names under rules/),
    then ``extra`` (a target rule)."""
    lines = [
        "",
        "import sys",
        f'sys.path.insert(0, "{ROOT}/src")',
        "from agentrl.config import check_workflow_config",
        f'configfile: "{ROOT}/config.yaml"',
        "check_workflow_config(config, [])  # as workflow/Snakefile: coerce, validate, fill the defaults",
        *(f'include: "{ROOT}/rules/{name}"' for name in ("common.smk", *rule_files)),
    ]
    return "\n".join(lines) + "\n" + extra


def prepare_results(root: Path, data: dict) -> Path:
    """``root/results`` laid out as the workflow's: the embedded data of config section ``data``
    (results/data) and the embedded tiny model as the SFT model (results/models/sft), each written
    by its stage's CLI."""
    config = root / "inputs.yaml"
    config.write_text(yaml.safe_dump({"data": data}))
    results = root / "results"
    stages = (
        ["prepare-data", "--sft", "data/sft.parquet", "--rl-pool", "data/rl_pool.parquet", "--eval-dir", "data/eval"],
        ["base-model", "--sft", "data/sft.parquet", "--rl-pool", "data/rl_pool.parquet", "--out", "models/sft"],
    )
    for stage, *paths in stages:
        args = [str(results / path) if path.startswith(("data", "models")) else path for path in paths]
        command = [sys.executable, "-m", "agentrl", stage, "--config", str(config), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=snakemake_env())
        assert done.returncode == 0, done.stderr
    return results


def workdir_with_results(inputs: Path, path: Path, snakefile: str) -> Path:
    """``path`` as a workflow folder: a copy of ``inputs/results`` (:func:`prepare_results`) and a
    Snakefile, its outputs then newer than its inputs at the file system's time resolution."""
    shutil.copytree(inputs / "results", path / "results")
    (path / "Snakefile").write_text(snakefile)
    time.sleep(1.1)
    return path
