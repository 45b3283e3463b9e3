"""A stage run as one process makes its process group on a store of its own: an inherited
launcher environment whose port another process holds does not stop it, and the launcher
variables it sets (vLLM's colocated engine reads them) name its own store."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from agentrl.training.deepspeed_engine import LAUNCHER_VARIABLES

SRC = Path(__file__).resolve().parents[1] / "src"

# What a child process reports: its group and the launcher variables after init_distributed.
PROBE = """
import json, os
from agentrl.training.deepspeed_engine import LAUNCHER_VARIABLES, close_distributed, init_distributed
ctx = init_distributed(1)
env = {k: os.environ.get(k) for k in LAUNCHER_VARIABLES}
print(json.dumps({"world": ctx.world_size, "rank": ctx.rank, "env": env}))
close_distributed()
"""


def _probe(env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, env=env, cwd=SRC.parent
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def test_an_inherited_one_process_launcher_env_whose_port_is_held_still_makes_a_group():
    """The pytest process, or a stage that ran a group in-process, holds the port it set in
    MASTER_PORT; a stage it starts inherits RANK=0, WORLD_SIZE=1 and that port."""
    held = torch.distributed.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
    env = {**_clean_env(), "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(held.port)}
    report = _probe(env)
    assert (report["world"], report["rank"]) == (1, 0)
    assert report["env"]["MASTER_PORT"] not in (None, str(held.port))  # its own store's
    del held


def test_a_one_process_group_names_its_own_store_in_the_launcher_variables():
    """DeepSpeed's ZeRO code reads LOCAL_RANK, vLLM's external-launcher executor RANK, LOCAL_RANK,
    MASTER_ADDR and MASTER_PORT (the colocated engine joins the trainer's group)."""
    report = _probe(_clean_env())
    env = report["env"]
    assert (report["world"], env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == (1, "0", "1", "0")
    assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
