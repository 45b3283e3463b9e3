"""What a run on a site checks before it plans: the SLURM profile's placeholders, conda for --sdm conda.

profiles/slurm ships with ``YOUR_ACCOUNT`` and ``YOUR_..._PARTITION`` for a site to replace: a dry
run plans with them and warns, naming each key and the file to edit; a run is refused when the
workflow loads, before anything is submitted (rules/cluster.smk ``check_placeholders``). ``--sdm
conda`` without a conda command stops at load with what to install or how to run without it
(``check_conda``), where Snakemake said only "Error running conda info". The paper preset's dry run
under the SLURM profile is read here too: short commands, each job's requests on one line.
Every command runs snakemake for real, from the repository (the profiles' relative paths) into a
temporary folder (--directory).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.workflows import ROOT, jobs_in_listing, shell_commands

pytest.importorskip("snakemake_executor_plugin_slurm", reason="pip install -e '.[test]'")

PAPER = ("--configfile", "presets/paper-qwen3-4b.yaml")
ACCOUNT = "profiles/slurm/config.yaml: default-resources: slurm_account: 'YOUR_ACCOUNT'"
PARTITIONS = (
    "profiles/slurm/partitions.yaml (slurm-partition-config): partitions: YOUR_GPU_PARTITION, YOUR_CPU_PARTITION"
)


def _snakemake(workdir: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("AGENTRL_NODES", "AGENTRL_RUNNING_JOBS")}
    env.update(PYTHONPATH=str(ROOT / "src"), AGENTRL_GPUS_PER_NODE="8", OMP_NUM_THREADS="1")
    if path is not None:
        env["PATH"] = path
    command = [sys.executable, "-m", "snakemake", *args, "--directory", str(workdir)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_dry_run_warns_of_the_placeholders_and_shows_what_each_job_asks(tmp_path):
    done = _snakemake(tmp_path, "-n", "-p", "--profile", "profiles/slurm", *PAPER)
    listing = done.stdout + done.stderr
    assert done.returncode == 0, listing[-3000:]
    assert ACCOUNT in listing and PARTITIONS in listing, listing[:3000]
    assert "a run is refused until they are set" in listing
    # 205 KB with each job's config inline in its command (median 2.1 KB); 97 KB since
    assert len(listing) < 120_000, len(listing)
    long = [c[:80] for c in shell_commands(done.stdout) if len(c) >= 600]
    assert all("agentrl report " in c or "agentrl filter gather " in c for c in long), long  # they list their inputs
    block = done.stdout.split("\nrule grpo:\n", 1)[1].split("\n\n", 1)[0]
    resources = next(line for line in block.splitlines() if line.strip().startswith("resources:"))
    assert all(f" {request}" in resources for request in ("gpu=8,", "nodes=1,", "runtime=1440,")), resources
    assert "threads: 64" in block
    assert {"sft", "grpo", "evaluate", "report"} <= {rule for rule, _ in jobs_in_listing(listing)}


def test_a_run_with_the_placeholders_is_refused_before_anything_is_submitted(tmp_path):
    done = _snakemake(tmp_path, "--profile", "profiles/slurm", *PAPER)
    said = done.stdout + done.stderr
    assert done.returncode != 0
    assert ACCOUNT in said and PARTITIONS in said, said[-3000:]
    assert "sacctmgr -n show associations user=$USER format=account" in said
    assert "Building DAG of jobs" not in said, "refused when the workflow loads"
    assert not (tmp_path / ".snakemake" / "slurm_logs").exists()


def test_a_site_profile_with_its_own_names_plans_without_a_warning(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(ROOT / "profiles" / "slurm", site)
    for name, old, new in (
        ("config.yaml", "YOUR_ACCOUNT", "rl-lab"),
        ("partitions.yaml", "YOUR_GPU_PARTITION", "gpu"),
        ("partitions.yaml", "YOUR_CPU_PARTITION", "cpu"),
    ):
        (site / name).write_text((site / name).read_text().replace(old, new))
    done = _snakemake(tmp_path / "run", "-n", "--profile", str(site), *PAPER)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "placeholders" not in done.stdout + done.stderr and "slurm_account=rl-lab" in done.stdout


def test_sdm_conda_without_conda_says_what_is_needed(tmp_path):
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    if shutil.which("conda", path=path):
        pytest.skip("conda is installed here: the refusal needs a PATH without it")
    shutil.copy(ROOT / "config.yaml", tmp_path / "config.yaml")
    for args in (("-n",), ()):
        done = _snakemake(tmp_path, *args, "--cores", "1", "--sdm", "conda", path=path)
        said = done.stdout + done.stderr
        assert done.returncode != 0
        assert "--sdm conda (software-deployment-method: conda) builds each rule's environment" in said
        assert "there is no conda command on PATH here. Install conda (Miniforge" in said
        assert "or run without --sdm conda" in said and "Error running conda info" not in said
    # with a conda command the check lets Snakemake go on, to its own call of it (this one fails)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "conda").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "conda").chmod(0o755)
    done = _snakemake(tmp_path, "-n", "--cores", "1", "--sdm", "conda", path=f"{bin_dir}{os.pathsep}{path}")
    said = done.stdout + done.stderr
    assert "there is no conda command" not in said and "Error running conda info" in said
