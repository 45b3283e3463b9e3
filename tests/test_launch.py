"""The launch command for one process, one machine and SLURM jobs (pure: the environment is an argument)."""

from __future__ import annotations

import pytest

from agentrl.training.launch import (
    build_launch_command,
    cpus_per_process,
    first_host,
    is_launched,
    job_cpus,
    master_port,
    resolve_nproc_per_node,
    strip_launch_options,
    visible_gpus,
)

ARGS = ["agentrl", "sft", "--model", "m", "--data", "d"]


def _slurm(nodes: int, gpus_per_node: int, **extra: str) -> dict[str, str]:
    env = {
        "SLURM_JOB_ID": "123456",
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NODELIST": "gpu[01-02]" if nodes == 2 else "gpu07",
        "SLURM_NODEID": "0",
        "SLURM_GPUS_ON_NODE": str(gpus_per_node),
    }
    env.update(extra)
    return env


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [
        ("gpu[01-02]", "gpu01"),
        ("gpu07", "gpu07"),
        ("node7,node9", "node7"),
        ("gpu[01-02,05],cpu3", "gpu01"),
        ("gpu[5,1-2]", "gpu5"),
        ("rack[1-2]-n[007-008]", "rack1-n007"),
        ("a-b[08-10]-ib,c1", "a-b08-ib"),
    ],
)
def test_first_host_of_compressed_nodelists(nodelist, host):
    assert first_host(nodelist) == host


def test_first_host_refuses_garbage():
    with pytest.raises(ValueError, match="cannot parse"):
        first_host("gpu[01-02")


def test_single_process_needs_no_launcher():
    assert build_launch_command(ARGS, {}, 1, python="py") == ["py", "-m", *ARGS]


def test_one_machine_uses_standalone_torchrun():
    assert build_launch_command(ARGS, {}, 2, python="py") == [
        "py",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        *ARGS,
    ]


def test_slurm_one_node_eight_gpus():
    env = _slurm(1, 8, SLURM_STEP_NUM_NODES="1", SLURM_STEP_NUM_TASKS="1")
    nproc = resolve_nproc_per_node("auto", env)
    assert nproc == 8
    cmd = build_launch_command(ARGS, env, nproc, python="py")
    assert cmd == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "8", "-m", *ARGS]


def test_slurm_two_nodes_from_the_batch_step_goes_through_srun_once_per_node():
    """The batch step of a job with an mpi resource, as the SLURM job-step plugin runs its command: no
    SLURM_* variable but the job id (its run_job drops the rest), the node's GPUs claimed by
    agentrl.devices, the node count from --nodes (the rule's resource)."""
    env = {"SLURM_JOB_ID": "123456", "SLURM_JOBID": "123456", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    cmd = build_launch_command(ARGS, env, resolve_nproc_per_node("8", env), nnodes=2, threads=64, python="py")
    assert cmd == [
        "srun",
        "--nodes",
        "2",
        "--ntasks",
        "2",
        "--ntasks-per-node",
        "1",
        "--kill-on-bad-exit=1",
        "--gpus-per-node",
        "8",
        "--cpus-per-task",
        "64",
        "--mem=0",
        "py",
        "-m",
        *ARGS,
        "--nproc",
        "8",
        "--nodes",
        "2",
    ]


def test_an_sbatch_script_of_two_nodes_is_read_from_its_environment():
    env = _slurm(2, 8)  # a batch script of its own: the allocation's variables, no step variables
    cmd = build_launch_command(ARGS, env, resolve_nproc_per_node("auto", env), python="py")
    assert cmd[:9] == [
        "srun",
        "--nodes",
        "2",
        "--ntasks",
        "2",
        "--ntasks-per-node",
        "1",
        "--kill-on-bad-exit=1",
        "--gpus-per-node",
    ]


def test_several_nodes_outside_slurm_are_refused():
    with pytest.raises(ValueError, match="--nodes 2 outside a SLURM job"):
        build_launch_command(ARGS, {}, 2, nnodes=2)


@pytest.mark.parametrize("node_id", ["0", "1"])
def test_slurm_two_nodes_inside_the_per_node_step_runs_static_torchrun(node_id):
    env = _slurm(2, 8, SLURM_NODEID=node_id, SLURM_STEP_NUM_NODES="2", SLURM_STEP_NUM_TASKS="2")
    cmd = build_launch_command(ARGS, env, resolve_nproc_per_node("auto", env), python="py")
    assert cmd == [
        "py",
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--node_rank",
        node_id,
        "--master_addr",
        "gpu01",
        "--master_port",
        str(10000 + 123456 % 20000),
        "--nproc_per_node",
        "8",
        "-m",
        *ARGS,
    ]


def test_slurm_multi_node_refuses_a_step_with_one_task_per_gpu():
    env = _slurm(2, 8, SLURM_STEP_NUM_NODES="2", SLURM_STEP_NUM_TASKS="16")
    with pytest.raises(ValueError, match="AGENTRL_NODES"):
        build_launch_command(ARGS, env, 8)


def test_multi_node_inside_the_executors_one_task_step_is_refused_not_nested():
    """The SLURM executor runs a job as `srun -n1 ...` inside the allocation: that step holds the
    GPUs, so a nested per-node srun would hang; the stage says so instead."""
    env = _slurm(2, 8, SLURM_STEP_ID="0", SLURM_STEP_NUM_NODES="1", SLURM_STEP_NUM_TASKS="1")
    with pytest.raises(ValueError, match="already holds the job's GPUs"):
        build_launch_command(ARGS, env, 8)


@pytest.mark.parametrize(
    ("env", "available", "cpus"),
    [
        ({"SLURM_CPUS_PER_TASK": "16", "OMP_NUM_THREADS": "2"}, 64, 16),  # SLURM's allocation first
        ({"SLURM_CPUS_PER_GPU": "8", "SLURM_GPUS_ON_NODE": "8", "OMP_NUM_THREADS": "64"}, 128, 64),
        ({"SLURM_CPUS_PER_GPU": "8", "CUDA_VISIBLE_DEVICES": "0,1"}, 128, 16),
        ({"OMP_NUM_THREADS": "6"}, 32, 6),  # Snakemake's threads
        ({"OMP_NUM_THREADS": "64"}, 8, 8),  # never more than the CPUs this process may use
        ({}, 12, 12),
        ({"SLURM_CPUS_PER_TASK": "junk"}, 4, 4),
    ],
)
def test_job_cpus(env, available, cpus):
    assert job_cpus(env, available) == cpus


def test_cpus_are_shared_among_the_ranks_of_a_node():
    env = {"SLURM_CPUS_PER_GPU": "8", "SLURM_GPUS_ON_NODE": "8", "LOCAL_WORLD_SIZE": "8"}
    assert cpus_per_process(env, 128) == 8
    assert cpus_per_process({"OMP_NUM_THREADS": "2", "LOCAL_WORLD_SIZE": "4"}, 2) == 1


def test_sandbox_workers_null_follow_the_job_cpus(monkeypatch):
    from agentrl.config import load_config
    from agentrl.tools.factory import make_sandbox

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Snakemake exports for threads: 1
    for key in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_PER_GPU", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    cfg = load_config({"sandbox": {"workers": None, "preload_modules": []}}).sandbox
    expected = 1
    with make_sandbox(cfg) as sandbox:
        assert sandbox.concurrency == expected
    explicit = load_config({"sandbox": {"workers": 2, "preload_modules": []}}).sandbox
    with make_sandbox(explicit) as sandbox:
        assert sandbox.concurrency == 2


def test_master_port_prefers_the_environment():
    assert master_port({"MASTER_PORT": "4242", "SLURM_JOB_ID": "7"}) == 4242
    assert master_port({}) == 29500


def test_a_port_from_the_job_id_is_never_in_linux_s_ephemeral_range():
    """32768-60999 (net.ipv4.ip_local_port_range's default): the kernel may have given it to any outgoing
    connection on the node, and the rendezvous could not bind it."""
    ports = {master_port({"SLURM_JOB_ID": str(job)}) for job in range(0, 200000, 7)}
    assert min(ports) >= 1024 and max(ports) < 32768, (min(ports), max(ports))
    assert len(ports) > 19000, "jobs sharing a node still get ports of their own"


@pytest.mark.parametrize(
    ("env", "gpus"),
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_GPUS_ON_NODE": "8"}, 4),
        ({"CUDA_VISIBLE_DEVICES": ""}, 0),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, 0),
        ({"SLURM_GPUS_ON_NODE": "8"}, 8),
        ({"SLURM_GPUS_PER_NODE": "h100:4"}, 4),
        ({"SLURM_GPUS_PER_NODE": "8(x2)"}, 8),
        ({"SLURM_JOB_GPUS": "0,1"}, 2),
        ({}, None),
    ],
)
def test_visible_gpus(env, gpus):
    assert visible_gpus(env) == gpus


def test_nproc_resolution():
    assert resolve_nproc_per_node("auto", {}) == 1  # no GPU granted: one CPU process
    assert resolve_nproc_per_node("0", {"SLURM_GPUS_ON_NODE": "8"}) == 1
    assert resolve_nproc_per_node(3, {}) == 3
    with pytest.raises(ValueError, match="--nproc"):
        resolve_nproc_per_node("many", {})


def test_is_launched():
    assert is_launched({"RANK": "0", "WORLD_SIZE": "2"})
    assert not is_launched({"SLURM_PROCID": "0"})


def test_strip_launch_options_removes_both_spellings():
    argv = ["sft", "--nproc", "2", "--out", "o", "--nproc=auto", "--nodes", "2", "--nodes=2", "--threads", "4"]
    assert strip_launch_options(argv) == ["sft", "--out", "o", "--threads", "4"]


def test_sft_options_survive_torchrun_argument_parsing():
    """torchrun parses the forwarded command line too: no sft option may be (a prefix of) one of its own."""
    from torch.distributed.run import get_args_parser

    from agentrl.sft.cli import build_parser

    torchrun_options = [o for action in get_args_parser()._actions for o in action.option_strings]
    forwarded = [
        o
        for action in build_parser()._actions
        for o in action.option_strings
        if o.startswith("--") and o not in ("--help", "--nproc", "--nodes")  # launch options: never forwarded
    ]
    clashes = [(ours, theirs) for ours in forwarded for theirs in torchrun_options if theirs.startswith(ours)]
    assert clashes == []
