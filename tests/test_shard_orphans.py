"""Shard jobs are as safe as the trainers: one writer per shard file (a lock), an orphan stops
within seconds of its parent's death, a stopped job keeps its finished problems for the next one,
and a finished shard file is never written again. Real subprocesses and real signals.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.shard_runs import SHARD_CONFIG, alive, finished_problems, gather_shards, score_shard, shard_problems
from helpers.workflows import ROOT

from agentrl.data.records import write_records
from agentrl.sampling.shards import PARTIAL_SUFFIX

# Enough that a job stopped within seconds of its parent's death is mid-pool: the random policy
# scores about 33 problems a second on one fast core, and the parent watch looks every
# parent_watch.CHECK_EVERY_S (2 s).
POOL_SIZE = 200


@pytest.fixture(scope="module")
def big(random_policy_dir, tmp_path_factory):
    """A pool of POOL_SIZE problems and what one uninterrupted job gathers into."""
    root = tmp_path_factory.mktemp("big")
    write_records(shard_problems(POOL_SIZE), root / "pool.parquet")
    score_shard(random_policy_dir, root / "pool.parquet", root / "shards/0-of-1.jsonl", 0, 1)
    return root / "pool.parquet", gather_shards(root / "pool.parquet", [root / "shards/0-of-1.jsonl"], root)


ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def _command(random_policy_dir: Path, pool: Path, out: Path) -> list[str]:
    command = [sys.executable, "-m", "agentrl", "filter", "score-shard", "--config-json", json.dumps(SHARD_CONFIG)]
    command += ["--model", str(random_policy_dir), "--pool", str(pool), "--shard", "0", "--shards", "1"]
    return [*command, "--out", str(out), "--threads", "1", "--problems-per-chunk", "1"]


def _wait_for_lines(partial: Path, lines: int, alive: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not (partial.exists() and len(partial.read_bytes().splitlines()) >= lines):
        assert alive.poll() is None, "the job ended before it was stopped"
        assert time.monotonic() < deadline, f"not {lines} lines in 300 s"
        time.sleep(0.05)


@pytest.mark.slow  # a job per problem chunk, twice: about a minute under load
def test_an_orphaned_shard_job_stops_within_seconds_and_the_rerun_takes_its_problems_over(
    random_policy_dir, big, tmp_path
):
    pool, one = big
    out = tmp_path / "shards/0-of-1.jsonl"
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    shell = subprocess.Popen(  # the job's shell, as Snakemake starts it; its death orphans the job
        ["bash", "-c", shlex.join(_command(random_policy_dir, pool, out)) + " & wait"], env=ENV, start_new_session=True
    )
    _wait_for_lines(partial, 2, shell)
    (job,) = map(int, Path(f"/proc/{shell.pid}/task/{shell.pid}/children").read_text().split())
    os.kill(shell.pid, signal.SIGKILL)  # kill -9 of the parent alone: the job lives on, orphaned
    shell.wait()
    killed = time.monotonic()
    while alive(job):
        assert time.monotonic() - killed < 20, "the orphan still runs 20 s after its parent died"
        time.sleep(0.1)
    kept = finished_problems(partial)
    assert not out.exists() and 1 <= kept < POOL_SIZE, f"the orphan stopped after {kept} problems"
    again = subprocess.run(_command(random_policy_dir, pool, out), env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{kept} already finished, {POOL_SIZE - kept} to roll out" in again.stderr, "none rolled out twice"
    assert gather_shards(pool, [out], tmp_path) == one, "the result of an uninterrupted run"


@pytest.mark.slow  # two jobs on one shard file
def test_a_second_job_waits_for_the_first_and_a_sigterm_keeps_thefinished_problems(random_policy_dir, big, tmp_path):
    pool, one = big
    out = tmp_path / "shards/0-of-1.jsonl"
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    first = subprocess.Popen(_command(random_policy_dir, pool, out), env=ENV, stderr=subprocess.PIPE, text=True)
    _wait_for_lines(partial, 3, first)
    first.send_signal(signal.SIGSTOP)  # holds the lock, writes nothing while the second one starts
    second = subprocess.Popen(_command(random_policy_dir, pool, out), env=ENV, stderr=subprocess.PIPE, text=True)
    time.sleep(5)
    assert second.poll() is None, "the second job waits for the lock"
    written_so_far = partial.read_bytes()
    first.send_signal(signal.SIGTERM)
    first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=60) == 75
    stderr = first.stderr.read()
    assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr, stderr[-2000:]
    kept = finished_problems(partial)
    assert partial.read_bytes().startswith(written_so_far[: written_so_far.rindex(b"\n") + 1])
    assert second.wait(timeout=300) == 0
    stderr = second.stderr.read()
    assert f"{kept} already finished, {POOL_SIZE - kept} to roll out" in stderr, stderr[-3000:]
    assert gather_shards(pool, [out], tmp_path) == one


def test_a_finished_shard_file_is_never_written_again(random_policy_dir, pool_scored_in_one_job, tmp_path):
    pool, finished, _ = pool_scored_in_one_job
    out = tmp_path / "shards/0-of-1.jsonl"
    out.parent.mkdir()
    shutil.copy2(finished, out)  # what an orphan that got its last problem in left
    before = (out.read_bytes(), out.stat().st_mtime_ns)
    score_shard(random_policy_dir, pool, out, 0, 1)
    assert (out.read_bytes(), out.stat().st_mtime_ns) == before
    assert not out.with_name(out.name + PARTIAL_SUFFIX).exists()
