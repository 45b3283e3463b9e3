"""One trainer per checkpoint folder, and a stage whose parent died stops at its next step boundary.

Real processes and signals: a lock held by another process, a parent killed with SIGKILL, two
real ``sft`` trainers on one folder, and ``kill -9`` of snakemake alone followed by the recovery
recipe (``snakemake --unlock``, then ``--rerun-incomplete``).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers.grpo_runs import arith_split, metric_records_so_far, unsaved_grpo_command
from helpers.sft_runs import BASE_SFT, sft_env, sft_run_args, sft_workspace
from helpers.stage_inputs import CODE_PROBLEM, fake_model

from agentrl.training.folder_lock import LOCK_FILE, CheckpointFolderInUse, hold_checkpoint_folder
from agentrl.training.parent_watch import ancestors
from agentrl.training.preemption import EXIT_CODE

HOLD = textwrap.dedent(
    """
    import sys, time
    from agentrl.training.folder_lock import hold_checkpoint_folder
    with hold_checkpoint_folder(sys.argv[1], "grpo"):
        print("held", flush=True)
        time.sleep(600)
    """
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}


def test_a_second_holder_is_refused_naming_the_first_and_a_killed_holder_leaves_no_stale_lock(tmp_path):
    folder = tmp_path / "checkpoints"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointFolderInUse, match=rf"grpo process {holder.pid} on "):
            with hold_checkpoint_folder(folder, "sft"):
                pass
    finally:
        holder.kill()  # SIGKILL: no cleanup runs
        holder.wait()
    with hold_checkpoint_folder(folder, "sft"):  # the kernel released the dead holder's lock
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()


WATCHED_CHILD = textwrap.dedent(
    """
    import time
    from agentrl.training.parent_watch import stop_when_orphaned
    from agentrl.training.preemption import StopRequest
    stop = StopRequest()
    with stop_when_orphaned(stop, every_s=0.1):
        print("watching", flush=True)
        while not stop.requested:
            time.sleep(0.05)
    print(stop.reason, flush=True)
    """
)
# The parent starts the watched child with its output on the test's pipe, then waits forever.
PARENT = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', sys.argv[1]]); time.sleep(600)"


def test_ancestors_are_this_process_parents_nearest_first():
    chain = ancestors()
    assert chain[0].pid == os.getppid() and all(p.pid != 1 for p in chain)


def test_the_exit_of_a_parent_sets_the_stop_request():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, WATCHED_CHILD], env=_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout.readline().strip() == "watching"
        parent.kill()  # kill -9 of the parent alone: the child lives on, reparented
        parent.wait()
        started = time.monotonic()
        reason = parent.stdout.readline().strip()  # the child still writes to the pipe
        assert reason.startswith(f"the exit of parent process {parent.pid} ("), reason
        assert time.monotonic() - started < 10
    finally:
        parent.stdout.close()


# --------------------------------------------------------------------------- real trainers
def test_grpo_refuses_a_held_checkpoint_folder_naming_the_holder_before_deepspeed_starts(tmp_path):
    """The real ``agentrl grpo`` CLI on a folder whose lock another process holds: exit 1, the
    holder's pid in the message, no traceback; the lock is taken before DeepSpeed's distributed
    init (its log line never appears) and nothing is written."""

    from agentrl.data.records import write_records

    folder = tmp_path / "checkpoints"
    train = tmp_path / "rl_train.parquet"
    write_records([CODE_PROBLEM], train)
    command = [sys.executable, "-m", "agentrl", "grpo", "--model", fake_model(tmp_path / "model"),
               "--train", train, "--out", tmp_path / "rl", "--metrics", tmp_path / "metrics.jsonl",
               "--checkpoint-dir", folder, "--nproc", "0"]  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        second = subprocess.run(list(map(str, command)), env=_env(), capture_output=True, text=True, timeout=300)
        assert holder.poll() is None, "the holder ended before the trainer tried"
        lock = json.loads((folder / LOCK_FILE).read_text())
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 1, second.stderr[-3000:]
    assert re.search(rf"in use by another trainer \(grpo process {holder.pid} on ", second.stderr), second.stderr[
        -3000:
    ]
    assert "Traceback" not in second.stderr, second.stderr[-3000:]
    assert "collectives wait up to" not in second.stderr, "DeepSpeed's distributed init ran before the lock"
    assert lock["pid"] == holder.pid, "the refused trainer rewrote the holder's lock file"
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "rl").exists()
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_FILE], "the refused trainer wrote into the folder"


def _steps(metrics: Path) -> list[int]:
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_a_second_trainer_on_the_same_checkpoint_folder_refuses_naming_the_first(tmp_path_factory):
    root = sft_workspace(tmp_path_factory.mktemp("sft-preempt"))
    sft = {**BASE_SFT, "epochs": 200, "save_every_steps": 4}  # 1200 steps: running while the second starts
    first = subprocess.Popen(
        sft_run_args(root, "run", sft, 1), env=sft_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    metrics = root / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while not (metrics.exists() and _steps(metrics)):
        assert first.poll() is None and time.monotonic() < deadline, "the first trainer did not start"
        time.sleep(0.1)
    second_args = sft_run_args(root, "run", sft, 1)
    second_args[second_args.index("--out") + 1] = str(root / "second-model")
    second_args[second_args.index("--metrics") + 1] = str(root / "second-metrics.jsonl")
    second = subprocess.run(second_args, env=sft_env(), capture_output=True, text=True, timeout=600)
    assert first.poll() is None, "the first trainer ended before the second tried"
    assert second.returncode == 1, second.stderr[-3000:]
    assert re.search(rf"in use by another trainer \(sft process {first.pid} on ", second.stderr), second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    assert not (root / "second-metrics.jsonl").exists() and not (root / "second-model").exists()
    first.send_signal(signal.SIGUSR1)  # what the refusal suggests: checkpoint, then exit
    _, stderr = first.communicate(timeout=600)
    assert first.returncode == EXIT_CODE, stderr[-3000:]
    steps = _steps(metrics)
    assert steps == list(range(1, steps[-1] + 1)), "the first run alone wrote the metrics, every step once"
    assert (root / "run" / "ckpt" / "latest").read_text() == f"step_{steps[-1]}"


# The parent starts the command (argv[2:]) with its stderr in a file (argv[1]), prints the child's
# pid, then waits forever: killing it alone orphans the trainer, as kill -9 <snakemake> does.
TRAINER_PARENT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=open(sys.argv[1], 'w'))\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(3600)\n"
)


@pytest.mark.slow
def test_an_orphaned_grpo_trainer_stops_at_its_next_step_boundary_with_a_checkpoint(tmp_path):
    from helpers.rollout import random_policy

    from agentrl.data.records import write_records

    write_records(arith_split(9, "rl"), tmp_path / "rl_train.parquet")
    write_records(arith_split(3, "eval"), tmp_path / "arith.parquet")
    run, total = tmp_path / "run", 200  # far more steps than run before the watch (every 2 s) notices
    command = unsaved_grpo_command(random_policy(), tmp_path, run, max_steps=total, test_freq=0, val_before_train=False)
    log = tmp_path / "grpo.log"
    env = {**_env(), "OMP_NUM_THREADS": "1"}
    parent = subprocess.Popen(
        [sys.executable, "-c", TRAINER_PARENT, str(log), *command], env=env, stdout=subprocess.PIPE, text=True
    )
    trainer = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 600
        while not any(r["step"] >= 1 for r in metric_records_so_far(run / "metrics.jsonl")):
            assert time.monotonic() < deadline, "no GRPO step within 600 s"
            assert Path(f"/proc/{trainer}").exists(), log.read_text()[-3000:]
            time.sleep(0.05)
    finally:
        parent.kill()  # the parent alone: the trainer lives on, reparented
        parent.wait()
    deadline = time.monotonic() + 300
    while not _lock_is_free(run / "checkpoints"):
        assert time.monotonic() < deadline, f"the orphaned trainer {trainer} did not stop:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    text = log.read_text()
    stopped = re.search(rf"stopped on the exit of parent process {parent.pid} \(\S+\) after step (\d+)", text)
    assert stopped, text[-3000:]
    step = int(stopped[1])
    assert 1 <= step < total, text[-3000:]
    assert [r["step"] for r in metric_records_so_far(run / "metrics.jsonl")][-1] == step
    assert (run / "checkpoints" / "latest").read_text() == f"step_{step}", "the stop wrote its step's checkpoint"
    assert not (run / "rl" / "config.json").exists(), "a stopped run exports no final policy"


def _lock_is_free(folder: Path) -> bool:
    path = folder / LOCK_FILE
    if not path.exists():
        return False
    with open(path, "rb") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


@pytest.mark.slow
def test_kill_9_of_snakemake_alone_then_the_recovery_recipe_holds_every_step_once(tmp_path):
    from helpers.workflows import TINY, planned, snakemake, start_snakemake, wait_for, write_config

    # 4 conversations x 2 families, 2 per step: 4 steps an epoch, 200 steps; a checkpoint every 10.
    # Long enough (seconds on an idle machine) that the parent watch, polling every 2 s, sees the kill.
    sft = {"epochs": 50, "global_batch_size": 2, "micro_batch_size": 2, "save_every_steps": 10, "keep_checkpoints": 1}
    write_config(tmp_path, TINY, {"sft": sft})
    total = 200
    results = tmp_path / "results"
    checkpoints = results / "sft" / "checkpoints"
    running_metrics = results / "sft" / "metrics.jsonl"  # the output, written as SFT runs
    workflow = start_snakemake(tmp_path, "--until", "sft")
    try:
        wait_for(lambda: running_metrics.exists() and len(_steps(running_metrics)) >= 1, 600, "an SFT step", workflow)
    finally:
        workflow.kill()  # kill -9 of snakemake alone: its job's shell and the trainer live on
        workflow.wait()
    trainer = json.loads((checkpoints / LOCK_FILE).read_text())["pid"]
    # The orphan notices within seconds and stops after its running step, with a checkpoint.
    deadline = time.monotonic() + 300
    while not _lock_is_free(checkpoints):
        assert time.monotonic() < deadline, f"the orphaned trainer {trainer} did not stop"
        time.sleep(0.2)
    log_before = (results / "logs" / "sft.log").read_text()
    stopped = re.search(r"stopped on the exit of parent process \d+ \(\S+\) after step (\d+)", log_before)
    assert stopped, log_before[-3000:]
    assert int(stopped[1]) < total, "stopped before the end"
    assert (checkpoints / "latest").read_text() == f"step_{stopped[1]}"

    snakemake(tmp_path, "--unlock")
    done = snakemake(tmp_path, "--until", "sft", "--rerun-incomplete", timeout=900)
    log_after = (results / "logs" / "sft.log").read_text()
    assert f"after step {stopped[1]}" in log_after, log_after[-3000:]
    assert _steps(results / "sft" / "metrics.jsonl") == list(range(1, total + 1)), "every step once"
    assert planned(tmp_path, "--until", "sft") == [], done.stdout[-2000:]
