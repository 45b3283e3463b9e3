"""A stage run as one process makes its process group on a store of its own: an inherited
launcher environment whose port another process holds does not stop it, and it leaves nothing
in its environment that would make the stages it starts think a launcher started them."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

SRC = Path(__file__).resolve().parents[1] / "src"

# What a child process reports: its group, and the launcher variables init_distributed added.
PROBE = """
import json, os
from agentrl.training.deepspeed_engine import close_distributed, init_distributed
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
before = {k for k in keys if k in os.environ}
ctx = init_distributed(1)
added = sorted(k for k in keys if k in os.environ and k not in before)
print(json.dumps({"world": ctx.world_size, "rank": ctx.rank, "added": added}))
close_distributed()
"""


def _probe(env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, env=env, cwd=SRC.parent
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _clean_env() -> dict[str, str]:
    launcher = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def test_an_inherited_one_process_launcher_env_whose_port_is_held_still_makes_a_group():
    """The pytest process, or a stage that ran a group in-process, holds the port it set in
    MASTER_PORT; a stage it starts inherits RANK=0, WORLD_SIZE=1 and that port."""
    held = torch.distributed.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
    env = {**_clean_env(), "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(held.port)}
    assert _probe(env) == {"world": 1, "rank": 0, "added": ["LOCAL_RANK"]}
    del held


def test_a_one_process_group_leaves_no_launcher_variables_for_the_processes_it_starts():
    """Only LOCAL_RANK (DeepSpeed's ZeRO code reads it): with RANK and WORLD_SIZE a stage started
    from this process would take itself for one started by torchrun (training.launch.is_launched)
    and, given --nproc 2, run as one process."""
    assert _probe(_clean_env()) == {"world": 1, "rank": 0, "added": ["LOCAL_RANK"]}
