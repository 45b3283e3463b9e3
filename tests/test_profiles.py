"""What the cluster profiles ask for, read from the SLURM executor plugin's own submission code.

tests/slurm_submissions.py builds the paper preset's DAG under profiles/slurm and hands each job
to snakemake-executor-plugin-slurm's sbatch builder and to the job-step plugin's srun settings.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("snakemake_executor_plugin_slurm", reason="pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[1]
PAPER = "presets/paper-qwen3-4b.yaml"
GPU_RULES = {"sft": 8, "grpo": 8, "score_rl_pool": 1, "evaluate": 1}  # GPUs of one job


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"}


@pytest.fixture(scope="module")
def submissions() -> dict[str, list[dict]]:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "slurm_submissions.py"),
            "all",
            "--profile",
            "profiles/slurm",
            "--configfile",
            PAPER,
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    jobs: dict[str, list[dict]] = {}
    for job in json.loads(done.stdout.strip().splitlines()[-1]):
        jobs.setdefault(job["rule"], []).append(job)
    return jobs


def _flags(call: str) -> list[str]:
    return call.split()


@pytest.mark.parametrize("rule", sorted(GPU_RULES))
def test_gpu_rules_ask_for_one_node_its_gpus_and_cpus_per_gpu(submissions, rule):
    gpus = GPU_RULES[rule]
    for job in submissions[rule]:
        sbatch, srun = _flags(job["sbatch"]), _flags(job["srun"])
        cpus_per_gpu = job["resources"]["cpus_per_gpu"]
        assert "--nodes=1" in sbatch and f"--gpus={gpus}" in sbatch, job["sbatch"]
        assert f"--cpus-per-gpu={cpus_per_gpu}" in sbatch, job["sbatch"]
        assert not any(f.startswith("--cpus-per-task") for f in sbatch), "cpus_per_task would override cpus_per_gpu"
        assert not any(f.startswith("--ntasks") for f in sbatch), job["sbatch"]
        # the job step inside the allocation: the same GPUs and CPUs, on the one node
        assert srun == [f"--cpus-per-gpu={cpus_per_gpu}", f"--gpus={gpus}", "--nodes=1"]
        assert not job["mpi"]  # the step is srun -n1: the stage's launcher starts the ranks
        # threads (what torch and the sandbox size themselves by) = the CPUs the job gets
        assert job["threads"] == gpus * cpus_per_gpu
        assert "-p YOUR_GPU_PARTITION" in job["sbatch"]


def test_gpu_rules_ask_for_memory_and_time(submissions):
    expected = {
        "sft": (512000, 1440),
        "grpo": (1000000, 4320),
        "score_rl_pool": (128000, 2880),
        "evaluate": (128000, 720),
    }
    for rule, (mem_mb, minutes) in expected.items():
        for job in submissions[rule]:
            assert f"--mem {mem_mb}" in job["sbatch"] and f"-t {minutes}" in job["sbatch"], job["sbatch"]


def test_training_gets_eight_gpus_times_eight_cpus(submissions):
    (sft,) = submissions["sft"]
    (grpo,) = submissions["grpo"]
    for job in (sft, grpo):
        assert "--gpus=8" in job["sbatch"] and "--cpus-per-gpu=8" in job["sbatch"] and job["threads"] == 64


def test_cpu_rules_stay_small(submissions):
    cpu_rules = set(submissions) - set(GPU_RULES) - {"all"}
    assert {"prepare_data", "base_model", "select_rl_data", "report", "hub_download"} <= cpu_rules
    for rule in cpu_rules:
        for job in submissions[rule]:
            sbatch = _flags(job["sbatch"])
            assert not any(f.startswith("--gpus") or f.startswith("--gres") for f in sbatch), job["sbatch"]
            assert f"--cpus-per-task={job['threads']}" in sbatch and job["threads"] <= 2, job["sbatch"]
            assert "-p YOUR_CPU_PARTITION" in job["sbatch"]


def test_the_hub_download_is_the_only_local_job_with_network(submissions):
    local = {rule for rule, jobs in submissions.items() for job in jobs if job["localrule"]}
    assert local == {"all", "hub_download"}
    # the jobs that read hub data and models run offline, after the download
    assert not submissions["prepare_data"][0]["localrule"] and not submissions["base_model"][0]["localrule"]


def _dry_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["snakemake", "-n", *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("option", "rule"),
    [(["--set-resources", "sft:nodes=2"], "sft"), (["--default-resources", "nodes=2"], "")],
)
def test_nodes_above_one_are_refused_before_anything_is_submitted(option, rule):
    done = _dry_run("--profile", "profiles/slurm", "--configfile", PAPER, *option)
    said = done.stdout + done.stderr
    assert done.returncode != 0, said[-2000:]
    assert f"resources nodes=2 in the {rule}" in said and "submit multi-node training with sbatch" in said


def test_local_profile_gives_gpu_jobs_their_gpus_and_cpus():
    # --cores as on a 128-core workstation: Snakemake caps a job's threads at the cores it has
    done = _dry_run("--profile", "profiles/local", "--configfile", PAPER, "--printshellcmds", "--cores", "128")
    assert done.returncode == 0, done.stderr[-2000:]
    commands = [line for line in done.stdout.splitlines() if line.startswith("Shell command:")]
    seen = {"training": 0, "rollouts": 0}
    for command in commands:
        if re.search(r"python -m agentrl (sft|grpo) ", command):
            kind, gpus, threads = "training", 8, "--nproc 8 --threads 64"
        elif re.search(r"python -m agentrl (evaluate (run|shard)|filter score)", command):
            kind, gpus, threads = "rollouts", 1, "--threads 8"
        else:
            assert "agentrl.devices" not in command or "--gpus 0 --" in command, command[:200]
            continue
        # each GPU job claims its own devices (agentrl.devices) before the stage starts
        assert command.startswith(f"Shell command: python -m agentrl.devices --gpus {gpus} -- "), command[:200]
        assert threads in command, command[-400:]
        seen[kind] += 1
    assert seen["training"] == 2 and seen["rollouts"] >= 13  # sft, grpo; 3 x 4 evaluations + scoring


def _gpu_capable_rules() -> set[str]:
    """Rules declaring the gpu resource (rules/common.smk on_gpus): `gpu=0` in their block."""
    names = set()
    for smk in (ROOT / "rules").glob("*.smk"):
        for block in re.split(r"\n\s*rule ", smk.read_text())[1:]:
            name = block.split(":", 1)[0].strip()
            if re.search(r"\bgpu=0\b", block.split("\nrule ")[0]):
                names.add(name)
    return names


@pytest.mark.parametrize("profile", ["local", "slurm"])
def test_every_gpu_capable_rule_gets_gpus_and_threads_in_both_profiles(profile):
    config = yaml.safe_load((ROOT / "profiles" / profile / "config.yaml").read_text())
    rules = _gpu_capable_rules()
    assert {"sft", "grpo", "evaluate", "score_rl_pool"} <= rules
    for rule in rules:
        assert config["set-resources"].get(rule, {}).get("gpu", 0) >= 1, f"profiles/{profile}: {rule} has no gpu"
        assert rule in config["set-threads"], f"profiles/{profile}: {rule} has no threads (CPUs follow GPUs)"
