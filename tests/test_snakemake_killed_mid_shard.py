"""``kill -9`` of snakemake alone while a scoring or an evaluation shard job runs, then the recovery
docs/operations.md gives (``snakemake --unlock``, then the same command with ``--rerun-incomplete``).

The job lives on, orphaned (snakemake's death kills none of its children): it must stop within
seconds (its parent watch), keep the problems it finished in its partial shard file, and the
rerun's job must roll out only the others (its log counts them), so that the gathered files equal
an uninterrupted run's byte for byte. test_shard_orphans.py checks the same of one job whose shell
is killed; here Snakemake really starts, loses and reruns the jobs. Slow: real rollouts, three
workflow runs per stage.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from helpers.shard_runs import SHARD_CONFIG, alive, command_line, descendants, finished_problems
from helpers.workflows import (
    merged,
    prepare_results,
    rules_snakefile,
    snakemake,
    start_snakemake,
    wait_for,
    workdir_with_results,
)

from agentrl.sampling.shards import PARTIAL_SUFFIX

pytestmark = pytest.mark.slow

# Enough problems, each long enough, that a job stopped within seconds of snakemake's death is
# mid-shard: at SHARD_CONFIG's 24 tokens, 24 problems roll out in about a second, under the parent
# watch's own period.
SMALL = merged(
    SHARD_CONFIG,
    {
        "data": {
            "embedded": {"families": ["arith"], "sft_per_family": 4, "rl_pool_per_family": 48, "eval_per_family": 48}
        },
        "rollout": {"max_response_tokens": 96, "max_turns": 3},
        "reward": {"overlong": {"max_response_length": 96, "buffer_length": 16}},
        "filter": {"k": 2},
        "eval": {"n": 2},
    },
)
# stage -> (target, its shard file, the shard job's log, the files compared with an uninterrupted run)
STAGES = {
    "scoring": (
        "results/filter/pass_rates.parquet",
        "results/filter/shards/0-of-1.jsonl",
        "results/logs/score_rl_pool/0-of-1.log",
        ("results/filter/pass_rates.parquet", "results/filter/samples.jsonl"),
    ),
    "evaluation": (
        "results/eval/sft/arith/metrics.json",
        "results/eval/sft/arith/shards/0-of-1.jsonl",
        "results/logs/evaluate/sft/arith/0-of-1.log",
        ("results/eval/sft/arith/samples.jsonl", "results/eval/sft/arith/metrics.json"),
    ),
}
ORPHAN_GONE_S = 20  # the parent watch looks every second; a loaded machine stops a job slower


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    prepare_results(root, SMALL["data"])
    return root


def _workdir(inputs: Path, path: Path) -> Path:
    workdir = workdir_with_results(inputs, path, rules_snakefile("filter.smk", "eval.smk"))
    (workdir / "small.yaml").write_text(yaml.safe_dump({**SMALL, "eval": {**SMALL["eval"], "models": ["sft"]}}))
    return workdir


def _args(workdir: Path, target: str, *more: str) -> tuple[str, ...]:
    return (target, *more, "--configfile", str(workdir / "small.yaml"))  # files after the targets


@pytest.mark.parametrize(
    "stage",
    # long: evaluation's shard jobs stop, keep and resume through the same agentrl.sampling.shards
    # as scoring's; CI runs the scoring case (and test_shard_orphans.py's scoring jobs)
    ["scoring", pytest.param("evaluation", marks=pytest.mark.long)],
)
def test_snakemake_killed_mid_shard_reruns_only_the_unfinished_problems(stage, inputs, tmp_path):
    target, shard, log, compared = STAGES[stage]
    whole = _workdir(inputs, tmp_path / "whole")
    snakemake(whole, *_args(whole, target), snakefile=whole / "Snakefile")

    killed = _workdir(inputs, tmp_path / "killed")
    partial = killed / (shard + PARTIAL_SUFFIX)
    first = start_snakemake(killed, *_args(killed, target), snakefile=killed / "Snakefile")
    try:
        wait_for(lambda: partial.exists() and finished_problems(partial) >= 1, 600, "a finished problem", first)
        jobs = [pid for pid in descendants(first.pid) if "-m agentrl" in command_line(pid)]
        assert jobs, "the shard job runs under snakemake"
        # frozen while snakemake dies, so that a loaded machine's delay here cannot let it finish
        for pid in jobs:
            os.kill(pid, signal.SIGSTOP)
        first.send_signal(signal.SIGKILL)  # snakemake alone: its jobs live on, orphaned
        first.wait()
    except BaseException:
        os.killpg(first.pid, signal.SIGKILL)
        raise
    for pid in jobs:
        os.kill(pid, signal.SIGCONT)
    gone = time.monotonic()
    while any(map(alive, jobs)):
        assert time.monotonic() - gone < ORPHAN_GONE_S, f"the orphan still runs {ORPHAN_GONE_S} s after snakemake died"
        time.sleep(0.1)
    total = SMALL["data"]["embedded"]["rl_pool_per_family" if stage == "scoring" else "eval_per_family"]
    kept = finished_problems(partial)
    assert not (killed / shard).exists() and 1 <= kept < total, f"the orphan stopped after {kept} of {total} problems"

    snakemake(killed, "--unlock", *_args(killed, target)[1:], snakefile=killed / "Snakefile")
    snakemake(killed, *_args(killed, target, "--rerun-incomplete"), snakefile=killed / "Snakefile")
    rerun_log = (killed / log).read_text()
    assert f"{kept} already finished, {total - kept} to roll out" in rerun_log, rerun_log[-3000:]
    for name in compared:
        assert (killed / name).read_bytes() == (whole / name).read_bytes(), (
            f"{name} differs from an uninterrupted run's"
        )
