"""What the cluster profiles ask for, read from the SLURM executor plugin's own submission code.

tests/helpers/slurm_submissions.py builds the paper preset's DAG under the site profile profiles/slurm and
the workflow profile workflow/profiles/default (which Snakemake adds by itself, sized by
AGENTRL_GPUS_PER_NODE) and hands each job to snakemake-executor-plugin-slurm's sbatch builder and
to the job-step plugin's srun settings.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("snakemake_executor_plugin_slurm", reason="pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[1]
PAPER = "presets/paper-qwen3-4b.yaml"
GPU_RULES = {"sft": 8, "grpo": 8, "score_rl_pool": 1, "evaluate": 1}  # GPUs of one job
WORKFLOW_PROFILE = ROOT / "workflow" / "profiles" / "default" / "config.yaml"
# Minutes per attempt, as docs/paper-scale.md's table says them (estimates with a margin there)
RUNTIMES = {"sft": 1440, "grpo": 1440, "score_rl_pool": 360, "evaluate": 360}


def _env(gpus: int | None = 8, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    for key in ("AGENTRL_GPUS_PER_NODE", "AGENTRL_NODES"):
        env.pop(key, None)
    env.update(extra)
    return env if gpus is None else {**env, "AGENTRL_GPUS_PER_NODE": str(gpus)}


def _submissions(*args: str, gpus: int | None = 8, **extra: str) -> dict[str, list[dict]]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "helpers" / "slurm_submissions.py"), *args],
        cwd=ROOT,
        env=_env(gpus, **extra),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    jobs: dict[str, list[dict]] = {}
    for job in json.loads(done.stdout.strip().splitlines()[-1]):
        jobs.setdefault(job["rule"], []).append(job)
    return jobs


@pytest.fixture(scope="module")
def submissions() -> dict[str, list[dict]]:
    return _submissions("all", "--profile", "profiles/slurm", "--configfile", PAPER)


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
    memory = {"sft": 512000, "grpo": 1000000, "score_rl_pool": 128000, "evaluate": 128000}
    for rule, minutes in RUNTIMES.items():
        for job in submissions[rule]:
            assert f"--mem {memory[rule]}" in job["sbatch"] and f"-t {minutes}" in job["sbatch"], job["sbatch"]


def test_memory_grows_with_the_attempt_up_to_a_cap_except_for_training():
    """A retry asks for twice the memory of the first attempt (an out-of-memory job gets more), never
    more than the cap; the training rules keep a node's share (their retries are 24 h pieces)."""
    third = _submissions("all", "--profile", "profiles/slurm", "--configfile", PAPER, "--attempt", "3")
    second = _submissions("all", "--profile", "profiles/slurm", "--configfile", PAPER, "--attempt", "2")
    memory = {
        "prepare_data": (64000, 96000),
        "select_rl_data": (32000, 48000),  # the site profile's default, 16000 at the first attempt
        "score_rl_pool": (256000, 256000),
        "evaluate": (256000, 256000),
        "sft": (512000, 512000),
        "grpo": (1000000, 1000000),
    }
    for rule, (at_two, at_three) in memory.items():
        for jobs, mem in ((second, at_two), (third, at_three)):
            assert f"--mem {mem} " in jobs[rule][0]["sbatch"] + " ", (rule, jobs[rule][0]["sbatch"])


@pytest.mark.parametrize("site", ["slurm"])
def test_a_failed_job_s_log_is_printed_by_snakemake(site):
    """Snakemake and the plugin cannot stop the retries of a refusal (exit 2); show-failed-logs makes
    each one loud: the stage's one line appears in snakemake's own output. (A local job prints its
    stage's error on the console itself, without the whole log: tests/test_console.py.)"""
    import snakemake.cli

    _, args = snakemake.cli.parse_args(["-n", "--profile", str(ROOT / "profiles" / site)])
    assert args.show_failed_logs is True


def test_the_docs_table_says_the_runtimes_the_jobs_ask_for():
    table = (ROOT / "docs" / "paper-scale.md").read_text()
    rows = {
        line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| `") and "--gpus=" in line
    }
    for rule, minutes in RUNTIMES.items():
        row = next(line for name, line in rows.items() if f"`{rule}`" in name)
        assert f"{minutes // 60} h" in row, f"docs/paper-scale.md: {rule} row does not say {minutes // 60} h: {row}"


def test_every_job_can_be_requeued_and_fits_a_partition_of_the_site_file(submissions):
    """--requeue (slurm-requeue): SLURM may requeue a preempted or node-failed job under its own id.
    Each job's partition is the one the plugin picks from profiles/slurm/partitions.yaml."""
    partitions = yaml.safe_load((ROOT / "profiles" / "slurm" / "partitions.yaml").read_text())["partitions"]
    for rule, jobs in submissions.items():
        for job in jobs:
            sbatch = _flags(job["sbatch"])
            assert "--requeue" in sbatch, job["sbatch"]
            partition = sbatch[sbatch.index("-p") + 1]
            assert job["resources"].get("runtime", 0) <= partitions[partition]["max_runtime"], (rule, partition)


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


def _dry_run(*args: str, gpus: int | None = 8, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["snakemake", "-n", *args], cwd=ROOT, env=_env(gpus, **extra), capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def two_node_submissions() -> dict[str, list[dict]]:
    return _submissions("all", "--profile", "profiles/slurm", "--configfile", PAPER, AGENTRL_NODES="sft:2,grpo:2")


@pytest.mark.parametrize("rule", ["sft", "grpo"])
def test_a_two_node_training_job_is_one_task_per_node_with_every_node_gpus(two_node_submissions, rule):
    """AGENTRL_NODES=grpo:2: one sbatch job of 2 nodes, one task each, 8 GPUs on each node (--gres, per node),
    the batch step running the rule's command (the job-step plugin's mpi branch: no srun -n1), and that command
    starting one srun task per node with a node's GPUs and CPUs (agentrl.training.launch)."""
    from agentrl.grpo.cli import build_parser as grpo_parser
    from agentrl.sft.cli import build_parser as sft_parser
    from agentrl.training.launch import build_launch_command, resolve_nproc_per_node, strip_launch_options

    (job,) = two_node_submissions[rule]
    sbatch = _flags(job["sbatch"])
    assert {"--nodes=2", "--ntasks=2", "--gres=gpu:8", "--cpus-per-gpu=8", "--mem", "-p"} <= set(sbatch), job["sbatch"]
    assert not any(f.startswith(("--ntasks-per-gpu", "--cpus-per-task", "--gpus")) for f in sbatch), job["sbatch"]
    assert job["mpi"] and job["srun"] is None, "the job-step plugin runs the command in the batch step"
    assert job["threads"] == 64, "threads are one node's"
    # the rule's command: the node's 8 GPUs claimed, then the stage with its launch options
    command = shlex.split(job["command"].split(" 2>&1 |")[0])
    assert command[:6] == ["python", "-m", "agentrl.devices", "--gpus", "8", "--"], command[:8]
    stage_argv = command[command.index(rule) + 1 :]
    args = (grpo_parser if rule == "grpo" else sft_parser)().parse_args(stage_argv)
    assert (args.nproc, args.nodes, args.threads) == ("8", 2, 64)
    # the batch step as the job-step plugin's run_job leaves it (no SLURM_* but the job id), after the claim
    batch = {"SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    module = ["agentrl", rule, *strip_launch_options(stage_argv)]
    nproc = resolve_nproc_per_node(args.nproc, batch)
    srun = build_launch_command(module, batch, nproc, nnodes=args.nodes, threads=args.threads, python="python")
    step = srun[: srun.index("python")]
    assert step == ["srun", "--nodes", "2", "--ntasks", "2", "--ntasks-per-node", "1", "--kill-on-bad-exit=1",
                    "--gpus-per-node", "8", "--cpus-per-task", "64", "--mem=0"]  # fmt: skip
    assert srun[-4:] == ["--nproc", "8", "--nodes", "2"]
    # each node's task: torchrun of 8 ranks, rendezvous on the first node
    node = {**batch, "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_NUM_NODES": "2"}  # fmt: skip
    torchrun = build_launch_command(module, node, 8, nnodes=2, python="python")
    assert torchrun[:13] == ["python", "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", "1",
                             "--master_addr", "gpu07", "--master_port", str(10000 + 4242), "--nproc_per_node", "8"]  # fmt: skip


def test_a_two_node_job_asks_for_the_gpus_of_each_node_not_of_the_job():
    """4 GPUs per node, two nodes: --gpus=8 would let SLURM place 6 + 2, where each node's step asks for 4."""
    jobs = _submissions("all", "--profile", "profiles/slurm", "--configfile", PAPER, gpus=4, AGENTRL_NODES="grpo:2")
    (job,) = jobs["grpo"]
    sbatch = _flags(job["sbatch"])
    assert "--nodes=2" in sbatch and "--gres=gpu:4" in sbatch, job["sbatch"]
    assert not any(f.startswith("--gpus") for f in sbatch), job["sbatch"]
    assert "-p YOUR_GPU_PARTITION" in job["sbatch"]  # the per-node count fits the partition's max_gpu
    command = shlex.split(job["command"].split(" 2>&1 |")[0])
    assert command[:6] == ["python", "-m", "agentrl.devices", "--gpus", "4", "--"], command[:8]
    assert "--nproc 4 --nodes 2" in job["command"], job["command"]
    (sft,) = jobs["sft"]  # one node: the job's GPUs, as before
    assert "--gpus=4" in sft["sbatch"] and "--nodes=1" in sft["sbatch"] and "--gres" not in sft["sbatch"]


def test_one_node_jobs_stay_as_they_were_beside_a_two_node_one(two_node_submissions):
    (sft,) = two_node_submissions["sft"]
    for job in two_node_submissions["evaluate"] + two_node_submissions["score_rl_pool"]:
        assert not job["mpi"] and "--nodes=1" in job["sbatch"] and "--gpus=1" in job["sbatch"]
    assert sft["mpi"]


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--set-resources", "grpo:nodes=2"], "resources nodes=2 in the grpo rule without the mpi resource"),
        (["--default-resources", "nodes=2"], "only the training rules"),
    ],
)
def test_nodes_without_the_workflow_profile_are_refused_before_anything_is_submitted(option, said):
    done = _dry_run("--profile", "profiles/slurm", "--configfile", PAPER, *option)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-2000:]
    assert said in out, out[-2000:]


def test_several_nodes_on_one_machine_are_refused():
    done = _dry_run("--profile", "profiles/local", "--configfile", PAPER, AGENTRL_NODES="grpo:2")
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-2000:]
    assert "resources nodes=2 in the grpo rule: this run has no SLURM executor" in out, out[-2000:]


def test_two_nodes_that_do_not_split_the_batches_are_refused():
    """16 ranks: the paper's SFT global batch (32) splits, GRPO's 64 prompts in mini-batches of 16 do too;
    4 nodes of 8 (32 ranks) do not split 16-prompt mini-batches."""
    done = _dry_run("--profile", "profiles/slurm", "--configfile", PAPER, AGENTRL_NODES="grpo:4")
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "the grpo rule's gpu resource (32 on 4 nodes)" in out, out[-2000:]


def test_a_slurm_dry_run_prints_the_threads_each_job_gets():
    """Snakemake gives a dry run --cores 1, which caps every job's threads; the profile's cores lifts the cap."""
    done = _dry_run("--profile", "profiles/slurm", "--configfile", PAPER, "--printshellcmds")
    assert done.returncode == 0, done.stderr[-2000:]
    commands = [line for line in done.stdout.splitlines() if line.startswith("Shell command:")]
    training = [c for c in commands if re.search(r"python -m agentrl (sft|grpo) ", c)]
    rollouts = [c for c in commands if re.search(r"python -m agentrl (evaluate (run|shard)|filter score)", c)]
    assert len(training) == 2 and all("--threads 64" in c for c in training), [c[-200:] for c in training]
    assert rollouts and all("--threads 16" in c for c in rollouts), rollouts[0][-200:]


def test_a_slurm_dry_run_without_a_gpu_count_warns():
    """The run itself is refused before any sbatch (tests/test_slurm_controller.py); its dry run shows the plan."""
    done = _dry_run("--profile", "profiles/slurm", "--configfile", PAPER, gpus=None)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "AGENTRL_GPUS_PER_NODE is not set: under the SLURM executor" in out, out[-2000:]
    cpu_run = _dry_run("--profile", "profiles/slurm", "--configfile", PAPER, gpus=0)
    out = cpu_run.stdout + cpu_run.stderr
    assert cpu_run.returncode == 0 and "AGENTRL_GPUS_PER_NODE is not set" not in out, out[-2000:]


def test_local_profile_gives_gpu_jobs_their_gpus_and_cpus():
    # --cores as on a 128-core workstation: Snakemake caps a job's threads at the cores it has
    done = _dry_run("--profile", "profiles/local", "--configfile", PAPER, "--printshellcmds", "--cores", "128")
    assert done.returncode == 0, done.stderr[-2000:]
    commands = [line for line in done.stdout.splitlines() if line.startswith("Shell command:")]
    seen = {"training": 0, "rollouts": 0}
    for command in commands:
        if re.search(r"python -m agentrl (sft|grpo) ", command):
            kind, gpus, threads = "training", 8, "--nproc 8 --nodes 1 --threads 64"
        elif re.search(r"python -m agentrl (evaluate (run|shard)|filter score)", command):
            kind, gpus, threads = "rollouts", 1, "--threads 16"
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


def _workflow_profile(gpus: int | None) -> dict:
    """The workflow profile as Snakemake reads it (YTE), with AGENTRL_GPUS_PER_NODE=gpus."""
    import yte

    script = "import json, sys, yte; print(json.dumps(yte.process_yaml(open(sys.argv[1]), require_use_yte=True)))"
    done = subprocess.run(
        [sys.executable, "-c", script, str(WORKFLOW_PROFILE)], env=_env(gpus), capture_output=True, text=True
    )
    assert yte and done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_every_gpu_capable_rule_gets_gpus_and_threads_from_the_workflow_profile():
    config = _workflow_profile(8)
    rules = _gpu_capable_rules()
    assert {"sft", "grpo", "evaluate", "score_rl_pool"} <= rules
    for rule in rules:
        resources = config["set-resources"].get(rule, {})
        assert resources.get("gpu", 0) >= 1, f"workflow profile: {rule} has no gpu"
        assert config["set-threads"][rule] == resources["gpu"] * resources["cpus_per_gpu"], rule


@pytest.mark.parametrize("site", ["local", "slurm"])
def test_site_profiles_leave_the_per_rule_keys_to_the_workflow_profile(site):
    """A top-level key of the workflow profile replaces the site profile's: the site sets none of them."""
    text = (ROOT / "profiles" / site / "config.yaml").read_text()
    keys = {line.split(":", 1)[0] for line in text.splitlines() if re.match(r"^[a-z-]+:", line)}
    per_rule = {key for key in _workflow_profile(8) if not key.startswith("__")}
    assert per_rule == {"set-resources", "set-threads"} and not keys & per_rule, keys & per_rule


def test_without_a_gpu_count_the_workflow_profile_sets_nothing_and_rules_run_on_cpus():
    """The embedded default (`snakemake --cores all`, no AGENTRL_GPUS_PER_NODE) runs as the rules declare."""
    assert {key for key in _workflow_profile(None) if not key.startswith("__")} == set()
    jobs = _submissions("all", gpus=None)
    assert jobs["sft"][0]["resources"]["gpu"] == 0 and jobs["sft"][0]["threads"] == 2
    assert all(job["resources"].get("gpu", 0) == 0 for rule in jobs.values() for job in rule)


def test_a_smaller_gpu_pool_without_the_gpu_count_is_refused_when_the_workflow_loads():
    done = _dry_run("--profile", "profiles/local", "--configfile", PAPER, "--resources", "gpu=4")
    said = done.stdout + done.stderr
    assert done.returncode != 0, said[-2000:]
    assert "--resources gpu=4" in said and "grpo (gpu=8)" in said and "sft (gpu=8)" in said, said[-2000:]
    assert "AGENTRL_GPUS_PER_NODE=4" in said


def test_a_gpu_pool_with_no_gpu_count_at_all_is_refused():
    done = _dry_run("--profile", "profiles/local", "--configfile", PAPER, gpus=None)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "AGENTRL_GPUS_PER_NODE is not set" in said, said[-2000:]


@pytest.mark.parametrize("site", ["local", "slurm"])
def test_the_gpu_count_sizes_every_gpu_job(site):
    """AGENTRL_GPUS_PER_NODE=4: every GPU job asks for at most 4, CPUs following; the local pool is 4."""
    cores = ["--cores", "128"] if site == "local" else []  # Snakemake caps a job's threads at the cores it has
    jobs = _submissions("all", "--profile", f"profiles/{site}", "--configfile", PAPER, *cores, gpus=4)
    for rule, gpus in GPU_RULES.items():
        for job in jobs[rule]:
            assert job["resources"]["gpu"] == min(gpus, 4), (rule, job["resources"])
            assert job["threads"] == job["resources"]["gpu"] * (8 if gpus == 8 else 16), (rule, job["threads"])
            if site == "slurm":
                assert f"--gpus={min(gpus, 4)}" in job["sbatch"], job["sbatch"]
    if site == "local":
        done = _dry_run("--profile", "profiles/local", "--configfile", PAPER, *cores, gpus=4)
        assert done.returncode == 0, done.stderr[-2000:]


def test_gpus_asked_by_gres_are_refused_when_the_workflow_loads():
    done = _dry_run("--profile", "profiles/slurm", "--configfile", PAPER, "--set-resources", "sft:gres=gpu:8")
    said = done.stdout + done.stderr
    assert done.returncode != 0, said[-2000:]
    assert "gres=gpu:8 in the sft rule" in said and "gpu_model" in said, said[-2000:]
