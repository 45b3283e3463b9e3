"""Each training rank takes its share of the job's CPUs (torch threads, OMP_NUM_THREADS, the
sandbox pool); the training stages' CUDA allocator and random state settings.

The two-rank run is real: torchrun starts this file twice, each rank goes through the training
stages' own start (:func:`agentrl.training.cli.launch`) with the job's ``--threads`` and
Snakemake's ``OMP_NUM_THREADS``, then reports what torch, OpenMP and a real sandbox got.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl.cpus import PROCESS_CPUS, claim_process_cpus, cpus_per_process, process_cpus
from agentrl.training.cli import cuda_allocator_settings
from agentrl.training.seeds import rng_state_kept

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("threads", "env", "available", "share"),
    [
        (64, {"LOCAL_WORLD_SIZE": "8", "OMP_NUM_THREADS": "64"}, 64, 8),  # the paper preset's node
        (64, {"OMP_NUM_THREADS": "64"}, 64, 64),  # one process: the job's threads, as before
        (2, {}, 16, 2),  # the embedded default's rules
        (64, {"LOCAL_WORLD_SIZE": "8"}, 16, 2),  # never more than the CPUs this process may use
        (4, {"LOCAL_WORLD_SIZE": "8"}, 64, 1),  # at least one
        (None, {"LOCAL_WORLD_SIZE": "4", "SLURM_CPUS_PER_TASK": "32"}, 64, 8),  # no --threads: the job's CPUs
        (None, {"OMP_NUM_THREADS": "6"}, 64, None),  # one process without --threads: torch's default
    ],
)
def test_a_process_share_is_the_job_threads_over_the_node_ranks(threads, env, available, share):
    assert process_cpus(threads, env, available) == share


def test_a_claimed_share_is_exported_and_is_what_the_sandbox_counts():
    env = {"LOCAL_WORLD_SIZE": "8", "OMP_NUM_THREADS": "64"}
    assert cpus_per_process(env, 64) == 8  # before the claim: OMP_NUM_THREADS is still the job's
    assert claim_process_cpus(64, env, available=64) == 8
    assert env["OMP_NUM_THREADS"] == env[PROCESS_CPUS] == "8"
    assert cpus_per_process(env, 64) == 8, "not divided by the ranks a second time"
    untouched = {"OMP_NUM_THREADS": "3"}
    assert claim_process_cpus(None, untouched, available=8) is None and untouched == {"OMP_NUM_THREADS": "3"}


def test_training_stages_get_expandable_segments_unless_the_environment_says_otherwise():
    assert cuda_allocator_settings({}) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert cuda_allocator_settings({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}) == {}


def test_building_an_engine_leaves_the_trainer_random_state_as_seeded():
    def reseed_everything(seed: int) -> None:  # what vLLM's worker does (set_random_seed)
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    torch.manual_seed(1234)
    random.seed(5)
    np.random.seed(6)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(1234)
    random.seed(5)
    np.random.seed(6)
    with rng_state_kept():
        reseed_everything(0)
        torch.rand(100)
    assert torch.equal(torch.rand(3), expected[0])
    assert (random.random(), np.random.rand()) == expected[1:]


def report_rank(out_dir: Path) -> None:
    """One torchrun rank: the training stages' start, then what each consumer of CPUs got."""
    from agentrl.config import load_config
    from agentrl.stage_cli import stage_parser
    from agentrl.tools.factory import make_sandbox
    from agentrl.training.cli import add_training_arguments, launch

    parser = stage_parser("sft", "two-rank CPU share")
    add_training_arguments(parser, "sft")
    argv = ["--out", "o", "--metrics", "m", "--checkpoint-dir", "c", "--nproc", "2", "--threads", "4"]
    launch(parser, "sft", argv, parser.parse_args(argv))
    cfg = load_config({"sandbox": {"workers": None, "preload_modules": []}}).sandbox
    with make_sandbox(cfg) as sandbox:
        workers = sandbox.concurrency
    report = {
        "torch_threads": torch.get_num_threads(),
        "omp": os.environ["OMP_NUM_THREADS"],
        "sandbox_workers": workers,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }
    (out_dir / f"rank{os.environ['RANK']}.json").write_text(json.dumps(report))


def test_two_ranks_each_take_half_of_the_job_threads(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "4", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    for key in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_PER_GPU", PROCESS_CPUS, "PYTORCH_CUDA_ALLOC_CONF"):
        env.pop(key, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run(
        [*command, __file__, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    share = max(1, min(4, len(os.sched_getaffinity(0))) // 2)
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["torch_threads"] == share and report["omp"] == str(share), report
        assert report["sandbox_workers"] == share, report
        assert report["alloc_conf"] == "expandable_segments:True"


if __name__ == "__main__":
    report_rank(Path(sys.argv[1]))
