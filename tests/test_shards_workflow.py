"""filter.shards through Snakemake: scatter, gather, the same bytes for any shard count, no rerun downstream.

A small Snakefile in a temporary folder includes the repository's ``rules/common.smk`` and
``rules/filter.smk`` with the repository's config (the embedded default, with a smaller pool and
budgets). The pool is the embedded generator's and the scoring model the embedded tiny model (the
base model stands in for the SFT model). Snakemake really scores the pool with one shard and,
in another folder, with three; the gathered files must be byte-identical, and so must the
selected RL set. Then, in the finished one-shard folder, another shard count plans only the
scoring shards and the gather, and running it selects nothing again. Slow: real scoring runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.workflows import prepare_results, rules_snakefile, workdir_with_results

# long: CI's shard checks are tests/test_shards.py and tests/test_snakemake_killed_mid_shard.py
pytestmark = [pytest.mark.slow, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[1]
SMALL = {
    "data": {"embedded": {"sft_per_family": 8, "rl_pool_per_family": 4, "eval_per_family": 2}},
    "filter": {"k": 4, "low": -1.0},  # the untrained model solves little: keep every problem
    "rollout": {"max_response_tokens": 64, "max_turns": 2},
    "reward": {"overlong": {"max_response_length": 64, "buffer_length": 16}},
    "sandbox": {"workers": 1, "preload_modules": []},
}
WRAPPER = rules_snakefile("filter.smk")
TARGET = "results/filter/rl_train.parquet"


def _snakemake(workdir: Path, shards: int, *args: str) -> str:
    config = workdir / f"shards{shards}.yaml"
    config.write_text(yaml.safe_dump({**SMALL, "filter": {**SMALL["filter"], "shards": shards}}))
    command = [sys.executable, "-m", "snakemake", "--cores", "2", "--directory", str(workdir)]
    command += ["-s", str(workdir / "Snakefile"), *args, "--configfile", str(config)]  # files after the targets
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=1500, cwd=workdir, env=env)
    assert done.returncode == 0, f"snakemake {' '.join(args)} failed:\n{done.stdout}\n{done.stderr[-6000:]}"
    return done.stdout + done.stderr


def _job_counts(output: str) -> dict[str, int]:
    """Rule -> jobs of the "Job stats" table (empty when there is nothing to do)."""
    if "Nothing to be done" in output:
        return {}
    counts = {}
    for line in output.split("Job stats:", 1)[1].splitlines()[3:]:
        fields = line.split()
        if len(fields) != 2 or fields[0] == "total":
            break
        counts[fields[0]] = int(fields[1])
    return counts


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """The embedded pool and model, in a folder laid out as results/."""
    root = tmp_path_factory.mktemp("inputs")
    prepare_results(root, SMALL["data"])
    return root


def _workdir(inputs: Path, path: Path) -> Path:
    return workdir_with_results(inputs, path, WRAPPER)


@pytest.fixture(scope="module")
def one_and_three(inputs, tmp_path_factory) -> tuple[Path, Path]:
    one = _workdir(inputs, tmp_path_factory.mktemp("one"))
    three = _workdir(inputs, tmp_path_factory.mktemp("three"))
    _snakemake(one, 1, TARGET)
    plan = _job_counts(_snakemake(three, 3, TARGET, "-n"))
    assert plan == {"score_rl_pool": 3, "gather_pass_rates": 1, "scoring_config": 1, "select_rl_data": 1}, plan
    _snakemake(three, 3, TARGET)
    return one, three


def test_three_shards_gather_the_bytes_of_one(one_and_three):
    one, three = one_and_three
    # each shard file and the lock its one writer held (agentrl.training.folder_lock.hold_shard_file)
    expected = sorted(name for i in range(3) for name in (f"{i}-of-3.jsonl", f"{i}-of-3.jsonl.lock"))
    assert sorted(p.name for p in (three / "results/filter/shards").iterdir()) == expected
    for name in ("pass_rates.parquet", "samples.jsonl", "rl_train.parquet"):
        assert (three / "results/filter" / name).read_bytes() == (one / "results/filter" / name).read_bytes(), name


def test_a_new_shard_count_reruns_no_selection(one_and_three):
    one, _ = one_and_three
    plan = _job_counts(_snakemake(one, 4, TARGET, "-n"))
    assert plan == {"score_rl_pool": 4, "gather_pass_rates": 1}, plan
    before = {name: (one / "results/filter" / name).read_bytes() for name in ("pass_rates.parquet", "rl_train.parquet")}
    out = _snakemake(one, 2, TARGET)
    assert _job_counts(out) == {"score_rl_pool": 2, "gather_pass_rates": 1}, out
    for shard in range(2):  # the one-shard file had every problem: nothing was rolled out again
        log = (one / f"results/logs/score_rl_pool/{shard}-of-2.log").read_text()
        assert "already finished, 0 to roll out" in log, log
    for name, content in before.items():
        assert (one / "results/filter" / name).read_bytes() == content, name
    assert _job_counts(_snakemake(one, 2, TARGET, "-n")) == {}
