"""Jobs of an earlier run on a results folder, found from squeue's text and the folder's lock files.

squeue's output is its documented ``--format`` text (no cluster here); the lock files are written by
real holders (agentrl.training.folder_lock) with a SLURM job id in their environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from agentrl.training.slurm_jobs import (
    PLUGINS,
    SQUEUE,
    PreemptionWatch,
    jobs_of_this_run,
    lock_holders,
    parse_squeue,
    parse_states,
    plugin_problems,
    preemption_message,
    refusal,
)

WORKDIR = "/scratch/u/agentrl"
SQUEUE_TEXT = "\n".join(
    [
        f"5001|RUNNING|{WORKDIR}|run-a|rule_grpo",
        f"5002|PENDING|{WORKDIR}|run-a|rule_evaluate_wildcards_model=rl,half=tools,benchmark=aime2024,shard=3",
        "5003|RUNNING|/home/u/other|run-b|rule_grpo",  # another checkout's run
        f"5004|RUNNING|{WORKDIR}|interactive|",  # the user's own shell job, no rule comment
        "5005|RUNNING|/elsewhere|run-c|rule_sft",  # submitted from elsewhere, but it holds our lock
    ]
)
HOLD = textwrap.dedent(
    """
    import sys
    from agentrl.training.folder_lock import hold_checkpoint_folder
    with hold_checkpoint_folder(sys.argv[1], "sft"):
        pass
    """
)


def test_squeue_text_is_read_by_field_and_rule():
    jobs = parse_squeue(SQUEUE_TEXT + "\n\n")
    assert [job.job_id for job in jobs] == ["5001", "5002", "5003", "5004", "5005"]
    assert [job.rule for job in jobs] == ["grpo", "evaluate", "grpo", None, "sft"]
    assert jobs[1].state == "PENDING" and jobs[0].workdir == WORKDIR
    assert SQUEUE[-1] == "--format=%i|%T|%Z|%j|%k" and "--me" in SQUEUE


def test_the_jobs_of_this_run_are_its_directory_s_rule_jobs_and_its_lock_holders(tmp_path):
    results = tmp_path / "results"
    env = {**os.environ, "SLURM_JOB_ID": "5005", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    subprocess.run([sys.executable, "-c", HOLD, str(results / "sft" / "checkpoints")], env=env, check=True)
    subprocess.run(
        [sys.executable, "-c", HOLD, str(tmp_path / "other" / "checkpoints")],
        env=env | {"SLURM_JOB_ID": "9"},
        check=True,
    )
    holders = lock_holders(results)
    assert holders == {"5005": str((results / "sft" / "checkpoints" / "trainer.lock").resolve())}
    found = jobs_of_this_run(parse_squeue(SQUEUE_TEXT), WORKDIR + "/", ["grpo", "evaluate", "sft"], holders)
    assert [job.job_id for job in found] == ["5001", "5002", "5005"]
    message = refusal(found, str(results), holders)
    assert "\n" not in message and "scancel 5001 5002 5005" in message
    assert "5005 (sft, RUNNING, holds " in message and "AGENTRL_RUNNING_JOBS=wait" in message
    assert "AGENTRL_RUNNING_JOBS=ignore" in message


def test_holders_in_the_lock_directory_count_for_the_folder_they_lock(tmp_path):
    results, locks = tmp_path / "results", tmp_path / "locks"
    env = {**os.environ, "SLURM_JOB_ID": "77", "AGENTRL_LOCK_DIR": str(locks)}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
    subprocess.run([sys.executable, "-c", HOLD, str(results / "rl" / "checkpoints")], env=env, check=True)
    assert list(lock_holders(results)) == [] and list(lock_holders(results, str(locks))) == ["77"]


def test_sacct_and_squeue_states_are_read_by_job():
    assert parse_states("11|RUNNING\n12|CANCELLED by 1001\n\n13|PREEMPTED\n") == {
        "11": "RUNNING",
        "12": "CANCELLED",
        "13": "PREEMPTED",
    }


def test_a_job_preempted_for_good_is_found_on_the_second_check_and_a_requeued_one_never(tmp_path, monkeypatch):
    """Real squeue and sacct calls, to the fake cluster's commands: a job preempted on a CANCEL partition
    stays PREEMPTED (and squeue forgets it after MinJobAge), a requeued one is PENDING again."""
    from helpers.fake_slurm import add_job, install, read_job, write_job

    state = tmp_path / "slurm"
    for key, value in install(tmp_path / "bin", state).items():
        monkeypatch.setenv(key, value)
    cancelled, forgotten, requeued, running = (
        add_job(state, state_name=name, workdir=WORKDIR, comment="rule_grpo")
        for name in ("PREEMPTED", "PREEMPTED", "PENDING", "RUNNING")
    )
    write_job({**read_job(forgotten, state), "purged": True}, state)
    watch = PreemptionWatch()
    submitted = [cancelled, forgotten, requeued, running]
    assert watch.gone(submitted) == set(), "not on the first check: SLURM may be about to requeue it"
    assert watch.gone(submitted) == {cancelled, forgotten}
    write_job({**read_job(running, state), "state": "PREEMPTED"}, state)
    assert watch.gone([running]) == set() and watch.gone([running]) == {running}
    message = preemption_message(cancelled, "grpo", "AGENTRL_GPUS_PER_NODE=8 snakemake --profile profiles/slurm")
    assert "\n" not in message.rstrip("\n") and f"SLURM job {cancelled} (grpo) was PREEMPTED" in message
    assert message.endswith("continue it with: AGENTRL_GPUS_PER_NODE=8 snakemake --profile profiles/slurm\n")


def test_the_installed_slurm_plugins_are_checked_against_the_pins_of_the_slurm_extra():
    import tomllib
    from importlib.metadata import PackageNotFoundError, version

    extra = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    pins = extra["optional-dependencies"]["slurm"]
    for name, (kind, wanted) in PLUGINS.items():
        assert any(pin.replace(" ", "").startswith(f"{name}{kind}{wanted}") for pin in pins), (name, pins)
    assert plugin_problems(version) == []  # this environment's: pip install -e '.[test]'

    def other(name: str) -> str:
        if name.endswith("jobstep"):
            raise PackageNotFoundError(name)
        return "3.0.1"

    assert plugin_problems(other) == [
        "snakemake-executor-plugin-slurm-jobstep is not installed",
        "snakemake-executor-plugin-slurm 3.0.1 is installed, the workflow is written against >=2.8",
    ]
    assert plugin_problems(lambda name: "0.6.2" if name.endswith("jobstep") else "2.9.0") == [
        "snakemake-executor-plugin-slurm-jobstep 0.6.2 is installed, the workflow is written against ==0.6.1"
    ]
