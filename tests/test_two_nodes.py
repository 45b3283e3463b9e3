"""Two "nodes" on this machine: SFT and GRPO trained by one torchrun agent per node, as a multi-node
SLURM job runs them, end with the weights of a one-node run of as many processes.

Each node is what the per-node ``srun`` task of a two-node job starts (agentrl.training.launch):
``python -m agentrl <stage> ... --nproc 1 --nodes 2`` in an environment with that step's SLURM
variables (its node id, a step of two tasks on two nodes, the node list). The stage's own launch
code reads them and re-executes itself as ``torchrun --nnodes 2 --node_rank <id> --master_addr
<first node> --master_port P``: two agents meeting at the first node's static rendezvous, one gloo
rank each. The one-node reference is ``--nproc 2`` (torchrun --standalone). Marked slow: four
training runs of two processes each.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from helpers.grpo_runs import TINY_RUN, grpo_command, metric_records, write_arith_inputs
from helpers.sft_runs import BASE_SFT, sft_env, sft_run_args, sft_run_results, train_sft_run
from safetensors.torch import load_file

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _node_env(base: dict[str, str], node: int, port: int) -> dict[str, str]:
    """What srun gives the task of ``node`` in a one-task-per-node step of a two-node job."""
    return {
        **base,
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NODEID": str(node),
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "MASTER_PORT": str(port),  # a free one: the port derived from the job id may be taken here
    }


def _run_two_nodes(command: list[str], env: dict[str, str], logs: Path) -> None:
    """``command`` (``--nproc 1 --nodes 2`` already in it) as the task of node 0 and of node 1, at once."""
    port = _free_port()
    logs.mkdir(parents=True, exist_ok=True)
    processes = []
    for node in (0, 1):
        with open(logs / f"node{node}.log", "w") as log:
            processes.append(
                subprocess.Popen(command, env=_node_env(env, node, port), stdout=log, stderr=subprocess.STDOUT)
            )
    try:
        codes = [process.wait(timeout=1500) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    said = "\n".join((logs / f"node{node}.log").read_text()[-3000:] for node in (0, 1))
    assert codes == [0, 0], said
    for node in (0, 1):  # each task went through the stage's own multi-node launch
        text = (logs / f"node{node}.log").read_text()
        assert f"--nnodes 2 --node_rank {node} --master_addr localhost --master_port {port}" in text, text[-3000:]


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6, msg=key)


def test_sft_on_two_nodes_ends_with_the_weights_of_one_node_of_two_processes(tiny_sft_workspace):
    sft = {**BASE_SFT, "deepspeed": {"zero_stage": 2}}
    one_node, one_node_weights = train_sft_run(tiny_sft_workspace, "one-node", sft, 2)
    command = [*sft_run_args(tiny_sft_workspace, "two-nodes", sft, 1), "--nodes", "2", "--threads", "1"]
    _run_two_nodes(command, sft_env(), tiny_sft_workspace / "two-nodes" / "logs")
    two_nodes, two_node_weights = sft_run_results(tiny_sft_workspace / "two-nodes")
    assert [m["step"] for m in two_nodes] == [m["step"] for m in one_node]
    torch.testing.assert_close(
        torch.tensor([m["loss"] for m in two_nodes]), torch.tensor([m["loss"] for m in one_node]), rtol=1e-5, atol=1e-6
    )
    _assert_same_weights(one_node_weights, two_node_weights)


def test_grpo_on_two_nodes_ends_with_the_weights_of_one_node_of_two_processes(tmp_path):
    from helpers.rollout import random_policy

    model, root = Path(random_policy()), write_arith_inputs(tmp_path / "inputs")
    run = {**TINY_RUN, "grpo": {**TINY_RUN["grpo"], "mini_batch_prompts": 2, "max_steps": 2, "micro_batch_tokens": 40}}
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"

    def command(name: str, nproc: int) -> list[str]:
        line = grpo_command(model, root, tmp_path / name)
        line[line.index("--config-json") + 1] = json.dumps(run)
        line[line.index("--nproc") + 1] = str(nproc)
        return line

    subprocess.run(command("one-node", 2), check=True, env=env, capture_output=True, timeout=1500)
    _run_two_nodes([*command("two-nodes", 1), "--nodes", "2"], env, tmp_path / "two-nodes" / "logs")
    one_node, two_nodes = (metric_records(tmp_path / name / "metrics.jsonl") for name in ("one-node", "two-nodes"))
    assert [r["step"] for r in two_nodes] == [0, 1, 2]
    assert all(r["rollout/trajectories"] == 4 for r in two_nodes[1:]), "each rank rolled out its half"
    for a, b in zip(one_node, two_nodes):  # the same rollouts, rewards and updates, step for step
        for key in a:
            if key.startswith(("rollout/", "actor/", "val/")) and not key.endswith("_s"):
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)
    state = json.loads((tmp_path / "two-nodes" / "checkpoints" / "step_2" / "trainer_state.json").read_text())
    assert state["fingerprint"]["world_size"] == 2
    _assert_same_weights(
        *(load_file(str(tmp_path / name / "rl" / "model.safetensors")) for name in ("one-node", "two-nodes"))
    )
