"""The collective timeout of SFT and GRPO reaches the process group: two processes under torchrun
(gloo), one rank late to a barrier. With a tiny ``grpo.collective_timeout_minutes`` the job fails
within seconds and the error names the key; with the default it waits and passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# What GRPO's train() does around its loop: the config's timeout into the process group, and the
# timeout error renamed after the key. Rank 1 reaches the barrier `delay` seconds after rank 0.
SCRIPT = """
import json, sys, time
import torch
from agentrl.config import load_config
from agentrl.grpo.trainer import TIMEOUT_KEY
from agentrl.training import deepspeed_engine as dse

cfg = load_config(json.loads(sys.argv[1]))
minutes = cfg.grpo.collective_timeout_minutes
with dse.collective_timeout_named(TIMEOUT_KEY, minutes):
    ctx = dse.init_distributed(minutes)
    if ctx.rank == 1:
        time.sleep(float(sys.argv[2]))
    torch.distributed.barrier()
print(f"rank {ctx.rank} passed")
"""


def _run(tmp_path, config: dict, delay: float) -> subprocess.CompletedProcess:
    script = tmp_path / "late_rank.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += [str(script), json.dumps(config), str(delay)]
    return subprocess.run(command, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_tiny_timeout_fails_fast_naming_the_key_and_the_default_waits_for_the_late_rank(tmp_path):
    late = 15.0
    done = _run(tmp_path, {"grpo": {"collective_timeout_minutes": 0.05}}, late)  # 3 s
    assert done.returncode != 0
    assert "grpo.collective_timeout_minutes = 0.05 minutes" in done.stderr, done.stderr[-3000:]
    # Had rank 0 waited for rank 1 (torch's 10 minutes), its barrier would have passed at 15 s.
    assert "rank 0 passed" not in done.stdout

    done = _run(tmp_path, {}, 5.0)  # the default (hours) waits for a rank 5 s late
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0 passed" in done.stdout and "rank 1 passed" in done.stdout


def test_the_default_timeout_is_hours_for_both_stages():
    from agentrl.config import load_config

    cfg = load_config({})
    assert cfg.grpo.collective_timeout_minutes >= 120 and cfg.sft.collective_timeout_minutes >= 120
