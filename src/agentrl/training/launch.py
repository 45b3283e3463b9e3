"""How a training stage starts its processes: one process, torchrun on one machine, or torchrun on
every node of a SLURM allocation.

Training stages (``sft``, ``grpo``) are invoked once, by Snakemake or by hand, as
``python -m agentrl <stage> ... --nproc N``. When they need more than one process and are not
already running under a launcher (no ``RANK``/``WORLD_SIZE`` in the environment), they re-execute
themselves through the command built here:

- one process in all: no launcher, the stage runs in place;
- one node: ``python -m torch.distributed.run --standalone --nproc_per_node N -m agentrl ...``
  (``--standalone`` picks a free rendezvous port, so two jobs on one machine do not collide);
- several SLURM nodes (``--nodes M``: the rule's ``nodes`` resource, or the allocation's node
  count): torchrun needs one agent per node. From the job's batch step (where the SLURM job-step
  plugin runs a job that has an ``mpi`` resource, with no ``srun -n1`` around it; the workflow
  profile gives one to multi-node training jobs) the stage first re-executes itself as
  ``srun --nodes M --ntasks M --ntasks-per-node 1 ...`` with the GPUs and CPUs of a node; each of
  those per-node tasks then builds the static-rendezvous torchrun command with
  ``--nnodes M --node_rank $SLURM_NODEID --master_addr <first host of SLURM_JOB_NODELIST>
  --master_port P`` (torchrun's own rendezvous: the first node's agent hosts it).

Processes per node: ``--nproc N`` when given (rules pass their GPUs per node), else the GPUs the
scheduler granted (CUDA_VISIBLE_DEVICES, then SLURM_GPUS_ON_NODE / SLURM_GPUS_PER_NODE /
SLURM_JOB_GPUS), else one CPU process.

CPUs: :mod:`agentrl.cpus` (what the job was given, and each process's share of it on a node).

Several nodes inside a one-task ``srun`` step (how the job-step plugin runs a job without an
``mpi`` resource) are refused (:func:`build_launch_command`): that step already holds the job's
GPUs and CPUs, so a per-node ``srun`` from there could not start.

Every function here is pure (the environment is an argument), so the SLURM cases are unit-tested
without a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from agentrl.cpus import cpus_per_process, job_cpus, visible_gpus

__all__ = ["cpus_per_process", "job_cpus", "visible_gpus"]  # where they were before agentrl.cpus

DEFAULT_MASTER_PORT = 29500
NPROC_OPTION = "--nproc"  # every stage started through here accepts it
NODES_OPTION = "--nodes"
# What only the launch reads: never forwarded to torchrun, which parses the whole command line
# with argparse, whose prefix matching would read ``--nproc`` as its own ``--nproc-per-node``.
LAUNCH_OPTIONS = (NPROC_OPTION, NODES_OPTION)


def strip_launch_options(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--nproc N`` / ``--nodes M`` (either spelling, ``--nproc=N`` too)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in LAUNCH_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(option + "=" for option in LAUNCH_OPTIONS)):
            out.append(arg)
    return out


def is_launched(env: Mapping[str, str]) -> bool:
    """True inside a process started by a launcher (torchrun sets RANK and WORLD_SIZE)."""
    return "RANK" in env and "WORLD_SIZE" in env


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list, compressed or not.

    ``gpu[01-02]`` -> ``gpu01``; ``gpu[01-02,05],cpu3`` -> ``gpu01``; ``rack[1-2]-n[07-08]`` ->
    ``rack1-n07``; ``node7,node9`` -> ``node7``. Zero padding is kept as written.
    """
    text = nodelist.strip()
    assert text, "empty SLURM node list"
    depth, end = 0, len(text)
    for i, char in enumerate(text):  # the first item ends at the first comma outside brackets
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            end = i
            break
    item = text[:end]

    def first_of_group(match: re.Match[str]) -> str:
        first = match.group(1).split(",")[0]
        return first.split("-")[0]

    host = re.sub(r"\[([^\]]*)\]", first_of_group, item)
    if not host or "[" in host or "]" in host:
        raise ValueError(f"cannot parse the SLURM node list {nodelist!r}")
    return host


def resolve_nproc_per_node(requested: str | int, env: Mapping[str, str]) -> int:
    """``--nproc``: a number (0 means no GPU: one CPU process) or ``auto`` (from the environment)."""
    if isinstance(requested, str) and requested.strip().lower() == "auto":
        return max(1, visible_gpus(env) or 0)
    try:
        count = int(requested)
    except ValueError:
        raise ValueError(f"--nproc must be a number or 'auto', got {requested!r}") from None
    if count < 0:
        raise ValueError(f"--nproc must be >= 0, got {count}")
    return max(1, count)


def num_nodes(env: Mapping[str, str], requested: int | None = None) -> int:
    """``--nodes`` when given (the rule's resource: the job-step plugin leaves a job's command no
    SLURM_* variable but the job id), else the node count of the SLURM allocation, else 1."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--nodes must be >= 1, got {requested}")
        return requested
    for key in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        value = env.get(key, "").strip()
        if value:
            if not value.isdigit():
                raise ValueError(f"{key}={value!r} is not a node count")
            return int(value)
    return 1


# Ports derived from a job id: below Linux's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999
# by default), from which the kernel hands out the source ports of outgoing connections (NCCL's, the
# shared file system's); 15000-34999 reached into it for 11% of job ids.
JOB_PORTS = (10000, 30000)


def master_port(env: Mapping[str, str]) -> int:
    """MASTER_PORT if set; else one derived from the SLURM job id (:data:`JOB_PORTS`), so jobs
    sharing a node differ."""
    if env.get("MASTER_PORT", "").strip():
        return int(env["MASTER_PORT"])
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if job_id.isdigit():
        low, high = JOB_PORTS
        return low + int(job_id) % (high - low)
    return DEFAULT_MASTER_PORT


def _one_task_per_node_step(env: Mapping[str, str], nnodes: int) -> bool:
    """Inside an srun step that runs exactly one task on each node of the allocation."""
    return (
        "SLURM_NODEID" in env
        and env.get("SLURM_STEP_NUM_NODES") == str(nnodes)
        and env.get("SLURM_STEP_NUM_TASKS") == str(nnodes)
    )


def world_size(env: Mapping[str, str], nproc_per_node: int, nnodes: int | None = None) -> int:
    return num_nodes(env, nnodes) * nproc_per_node


def _torchrun(python: str, nproc_per_node: int, rendezvous: list[str], module_args: Sequence[str]) -> list[str]:
    return [
        python,
        "-m",
        "torch.distributed.run",
        *rendezvous,
        "--nproc_per_node",
        str(nproc_per_node),
        "-m",
        *module_args,
    ]


def _per_node_srun(env: Mapping[str, str], nnodes: int, threads: int | None) -> list[str]:
    """``srun`` of one task on each node, each with the job's GPUs and CPUs of that node.

    The job-step plugin passes a job's command no SLURM_* variable but the job id, so srun
    learns the allocation from slurmctld and nothing defaults to the batch step's settings:
    the GPUs (those ``agentrl.devices`` claimed for the node, as on every node), the CPUs
    (the rule's threads: a node's) and ``--mem=0`` (all of the job's memory on each node) are
    said. ``--kill-on-bad-exit``: one node's failure ends the others instead of leaving them
    waiting in a collective.
    """
    srun = ["srun", "--nodes", str(nnodes), "--ntasks", str(nnodes), "--ntasks-per-node", "1", "--kill-on-bad-exit=1"]
    gpus = visible_gpus(env)
    if gpus:
        srun += ["--gpus-per-node", str(gpus)]
    if threads:
        srun += ["--cpus-per-task", str(threads)]
    return [*srun, "--mem=0"]


def build_launch_command(
    module_args: Sequence[str],
    env: Mapping[str, str],
    nproc_per_node: int,
    *,
    nnodes: int | None = None,
    threads: int | None = None,
    python: str = "python",
) -> list[str]:
    """The command that runs ``python -m <module_args>`` on every process of the job.

    ``module_args`` is what follows ``python -m`` (e.g. ``["agentrl", "sft", "--model", ...]``),
    without the launch options (see :func:`strip_launch_options`); the srun hop of a multi-node
    job passes ``--nproc N --nodes M`` (and ``--threads``, already in ``module_args``) on so that
    every node starts the same number of processes. ``nnodes``: ``--nodes`` (see :func:`num_nodes`).
    """
    assert module_args, "module_args must name the module to run"
    assert nproc_per_node >= 1, f"nproc_per_node must be >= 1, got {nproc_per_node}"
    nnodes = num_nodes(env, nnodes)
    plain = [python, "-m", *module_args]
    if nnodes == 1:
        if nproc_per_node == 1:
            return plain
        return _torchrun(python, nproc_per_node, ["--standalone"], module_args)
    if not _one_task_per_node_step(env, nnodes):
        if env.get("SLURM_STEP_NUM_TASKS") is not None:
            raise ValueError(
                f"a {nnodes}-node job, started inside an srun step of {env['SLURM_STEP_NUM_TASKS']} task(s) "
                f"on {env.get('SLURM_STEP_NUM_NODES', '?')} node(s): that step already holds the job's GPUs "
                "and CPUs, so the per-node srun that torchrun needs cannot start. The SLURM job-step plugin "
                "runs a job's command in the batch step only when the job has an mpi resource: ask for nodes "
                "with AGENTRL_NODES (the workflow profile adds it; docs/paper-scale.md, 'Several nodes')"
            )
        if not env.get("SLURM_JOB_ID", "").strip():
            raise ValueError(
                f"--nodes {nnodes} outside a SLURM job: one torchrun per node is started with srun, in a "
                f"{nnodes}-node allocation (the SLURM profile with AGENTRL_NODES); on one machine use --nodes 1"
            )
        forwarded = [NPROC_OPTION, str(nproc_per_node), NODES_OPTION, str(nnodes)]
        return [*_per_node_srun(env, nnodes, threads), *plain, *forwarded]
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise ValueError(f"a {nnodes}-node SLURM job without SLURM_JOB_NODELIST: cannot find the master node")
    rendezvous = ["--nnodes", str(nnodes), "--node_rank", env["SLURM_NODEID"], "--master_addr", first_host(nodelist)]
    return _torchrun(python, nproc_per_node, [*rendezvous, "--master_port", str(master_port(env))], module_args)


def relaunch_if_needed(
    stage: str,
    argv: Sequence[str],
    nproc_arg: str,
    env: Mapping[str, str] | None = None,
    *,
    nnodes: int | None = None,
    threads: int | None = None,
) -> None:
    """Re-execute ``python -m agentrl <stage> argv`` under torchrun/srun when one process is not enough.

    Does nothing inside a launched process (RANK / WORLD_SIZE set) or when one process is wanted;
    otherwise replaces the current process. Raises ValueError for an impossible request.
    """
    import logging
    import os
    import sys

    env = os.environ if env is None else env
    if is_launched(env):
        return
    nproc = resolve_nproc_per_node(nproc_arg, env)
    module_args = ["agentrl", stage, *strip_launch_options(argv)]
    command = build_launch_command(module_args, env, nproc, nnodes=nnodes, threads=threads, python=sys.executable)
    if world_size(env, nproc, nnodes) > 1:
        logging.getLogger(f"agentrl.{stage}").info("launching: %s", " ".join(command))
        sys.stdout.flush()
        sys.stderr.flush()
        from agentrl.training.preemption import ignore_stop_signals_in_launcher

        ignore_stop_signals_in_launcher()  # torchrun survives SIGUSR1; the workers checkpoint and stop
        os.execvp(command[0], command)
