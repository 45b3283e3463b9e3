"""The workflow's controller under the SLURM profile, against a SLURM cluster on this machine.

The real ``snakemake --profile profiles/slurm`` with snakemake-executor-plugin-slurm runs here (a
copy with the fake cluster's account and partitions for its placeholders, which a run refuses),
with fake SLURM commands first on PATH (tests/helpers/fake_slurm.py): ``sbatch`` records each
submission (and starts its job as a real process when the test lets it), ``squeue`` and
``sacct`` answer from the fake cluster's job files. A job that runs goes through the real chain of
a SLURM job: the batch script sbatch was given (the job step's ``snakemake --executor
slurm-jobstep``), the job-step plugin's ``srun -n1`` and the rule's command in it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.fake_slurm import add_job, install, jobs, sbatch_calls, site_profile
from helpers.workflows import TINY, snakemake, snakemake_command, snakemake_env, write_config

pytest.importorskip("snakemake_executor_plugin_slurm", reason="pip install -e '.[test]'")


class Cluster:
    """A results folder's workdir, the fake cluster's state and the environment that reaches it."""

    def __init__(self, root: Path, *overlays: dict) -> None:
        self.state = root / "slurm"
        self.workdir = root / "run"
        self.workdir.mkdir()
        write_config(self.workdir, *overlays)
        self.profile = str(site_profile(root / "profile"))
        env = {**snakemake_env(), **install(root / "bin", self.state)}
        for key in ("AGENTRL_GPUS_PER_NODE", "AGENTRL_NODES", "AGENTRL_RUNNING_JOBS", "SLURM_JOB_ID"):
            env.pop(key, None)
        self.env = env

    def snakemake(self, *args: str, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            snakemake_command(self.workdir, "--profile", self.profile, *args),
            cwd=self.workdir,
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def refused(self, *args: str, **extra: str) -> str:
        """The output of a run that must stop at load, before any sbatch (its jobs would never start)."""
        try:
            done = self.snakemake(*args, timeout=120, FAKE_SLURM_RUN="0", **extra)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run was not refused; it submitted {len(self.submissions())} job(s) and waited for them")
        out = done.stdout + done.stderr
        assert done.returncode != 0, out[-3000:]
        assert self.submissions() == [], "refused after a submission"
        return out

    def submissions(self) -> list[list[str]]:
        return sbatch_calls(self.state)

    def jobs_of(self, rule: str) -> list[dict]:
        return [job for job in jobs(self.state) if job["comment"] == f"rule_{rule}"]


@pytest.fixture
def cluster(tmp_path) -> Cluster:
    return Cluster(tmp_path)


# Each command, and what it ends with once past the workflow's load: exit 0, or Snakemake's own
# answer (no metadata is kept for a file that no job wrote).
MAINTENANCE = [
    (["--unlock"], None),
    (["--cleanup-metadata", "results/models/base/config.json"], "metadata was not present"),
    (["--summary"], None),
    (["--list-params-changes"], None),
    (["--dag"], None),
]


@pytest.mark.parametrize(("command", "answer"), MAINTENANCE, ids=[command[0] for command, _ in MAINTENANCE])
def test_commands_that_submit_nothing_are_not_refused_by_the_checks_of_a_submission(cluster, command, answer):
    """The recovery after a dead controller: its job still queued, no GPU count in this shell."""
    add_job(cluster.state, state_name="RUNNING", workdir=str(cluster.workdir), comment="rule_grpo")
    done = cluster.snakemake(*command)
    out = done.stdout + done.stderr
    assert "AGENTRL_GPUS_PER_NODE is not set" not in out and "still queued or running" not in out, out[-3000:]
    assert done.returncode == 0 if answer is None else answer in out, out[-3000:]
    assert cluster.submissions() == []


def test_a_dry_run_warns_of_what_the_run_would_refuse_and_the_run_is_refused_before_any_sbatch(cluster):
    old = add_job(cluster.state, state_name="PENDING", workdir=str(cluster.workdir), comment="rule_sft")
    dry = cluster.snakemake("-n")
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out[-3000:]
    assert "AGENTRL_GPUS_PER_NODE is not set" in out and f"scancel {old}" in out, out[-3000:]
    out = cluster.refused()
    assert "AGENTRL_GPUS_PER_NODE is not set: under the SLURM executor" in out, out[-3000:]
    out = cluster.refused(AGENTRL_GPUS_PER_NODE="0")
    assert f"still queued or running: {old} (sft, PENDING)" in out, out[-3000:]


HOLD = """
import sys, time
from agentrl.training.folder_lock import hold_checkpoint_folder
with hold_checkpoint_folder(sys.argv[1], "sft"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_held_checkpoint_folder_is_refused_before_any_job_is_submitted(cluster):
    """A trainer outside SLURM (by hand, or an orphan still stopping) holds the SFT folder: the sft job would
    refuse at its start after its wait for GPUs, at each retry; the controller refuses at load instead."""
    folder = cluster.workdir / "results" / "sft" / "checkpoints"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], env=cluster.env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        out = cluster.refused(AGENTRL_GPUS_PER_NODE="0")
        assert (
            f"{folder.relative_to(cluster.workdir)} is in use by another trainer (sft process {holder.pid} on " in out
        )
        assert "found before anything was submitted" in out, out[-3000:]
    finally:
        holder.kill()
        holder.wait()
    done = cluster.snakemake("-n", AGENTRL_GPUS_PER_NODE="0")  # free again: the plan goes on
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


def test_a_bad_config_is_refused_before_any_job_is_submitted(cluster):
    out = cluster.refused("--config", "sft={lr: -1}", AGENTRL_GPUS_PER_NODE="0")
    assert "sft.lr" in out, out[-3000:]


# The tiny workflow's SFT from the random base model, 8 steps of 2 conversations. The time limit's margin is
# all of the fake limit but 3 s, so the first step boundary is already within it however fast this machine
# is (two snakemake loads and the stage's start come before), and the job still has minutes to checkpoint.
FAKE_LIMIT_S = 300  # the first sft job's limit
SHORT_SFT = {
    "model": {"embedded": {"pretrain": {"enable": False}}},
    "sft": {
        "epochs": 2,
        "global_batch_size": 2,
        "micro_batch_size": 2,
        "save_every_steps": 0,
        "save_before_end_minutes": (FAKE_LIMIT_S - 3) / 60,
    },
}


@pytest.mark.slow
def test_a_training_job_near_its_time_limit_checkpoints_and_the_next_attempt_resumes(tmp_path):
    """No --signal, no signal at all: the trainer reads its job's end time (squeue, as the job-step plugin
    strips SLURM_JOB_END_TIME) and stops with a checkpoint before the limit; the job fails, Snakemake's retry
    submits it again and the new job resumes, every step trained once."""
    cluster = Cluster(tmp_path, TINY, SHORT_SFT)
    snakemake(cluster.workdir, "results/data/sft.parquet", "results/models/base/config.json", timeout=600)
    done = cluster.snakemake(
        "results/models/sft/config.json", "--retries", "1", "--slurm-init-seconds-before-status-checks", "5",
        timeout=900, AGENTRL_GPUS_PER_NODE="0", FAKE_SLURM_LIMIT_S=f"sft:{FAKE_LIMIT_S}", FAKE_SLURM_KILL_WAIT_S="2",
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    first, second = cluster.jobs_of("sft")
    assert (first["state"], second["state"]) == ("FAILED", "COMPLETED"), (first, second)
    attempts = (cluster.workdir / "results" / "logs" / "sft.attempts.log").read_text()
    assert "sft: stopped on the SLURM job's time limit (" in attempts and "(exit code 75)" in attempts, attempts[-3000:]
    stopped = int(attempts.split("after step ")[1].split(";")[0])
    assert 1 <= stopped < 8, attempts[-3000:]
    assert f"SFT done: 8 steps ({8 - stopped} this run)" in attempts.split("=== attempt started")[-1], attempts[-3000:]
    steps = [json.loads(line)["step"] for line in (cluster.workdir / "results" / "sft" / "metrics.jsonl").open()]
    assert steps == list(range(1, 9)), steps


@pytest.mark.slow
def test_a_job_preempted_for_good_is_submitted_again_instead_of_waited_for(cluster):
    """The data preparation's first job ends PREEMPTED and never runs (PreemptMode=CANCEL); the plugin alone
    would wait for it for ever. The run reports it failed in one line, its retry submits it again, the job runs."""
    try:
        done = cluster.snakemake(
            "results/data/sft.parquet", "--retries", "1", "--slurm-init-seconds-before-status-checks", "5",
            timeout=420, AGENTRL_GPUS_PER_NODE="0", FAKE_SLURM_PREEMPT="prepare_data",
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run waited for the preempted job: {[(j['id'], j['state']) for j in jobs(cluster.state)]}")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    first, second = cluster.jobs_of("prepare_data")
    assert (first["state"], second["state"]) == ("PREEMPTED", "COMPLETED")
    said = f"SLURM job {first['id']} (prepare_data) was PREEMPTED and SLURM will not run it again"
    assert said in out and "continue it with: AGENTRL_GPUS_PER_NODE=0 snakemake " in out, out[-4000:]
    assert (cluster.workdir / "results" / "data" / "sft.parquet").is_file()
