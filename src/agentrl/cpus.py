"""The CPUs of a job and each process's share of them: one rule for torch's threads and the sandbox.

:func:`job_cpus` is what the job was really given on this node (SLURM's allocation, else
Snakemake's ``threads``, never more than the CPUs this process may run on). A training stage
under torchrun runs one process per GPU on the node, and each one gets an equal share:
:func:`claim_process_cpus` (called once in every rank, before anything starts threads) sets the
rank's torch threads to it, exports ``OMP_NUM_THREADS`` as it (Snakemake exports the job's whole
``threads`` to every rank, and OpenMP in the sandbox's children would read that), and records it
in ``AGENTRL_PROCESS_CPUS``, which :func:`cpus_per_process` (the sandbox's pool size when
``sandbox.workers`` is null) then reads, so torch and the sandbox never count differently.

Functions take the environment as an argument (SLURM cases are unit-tested without a cluster);
only :func:`claim_process_cpus` writes to it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping

PROCESS_CPUS = "AGENTRL_PROCESS_CPUS"  # this process's share, once claimed


def _count_gpu_spec(spec: str) -> int | None:
    """SLURM_GPUS_PER_NODE forms: ``8``, ``h100:8``, ``h100:4,a100:2``, ``8(x2)``."""
    total = 0
    for part in spec.split(","):
        part = re.sub(r"\(x\d+\)$", "", part.strip())
        count = part.rsplit(":", 1)[-1]
        if not count.isdigit():
            return None
        total += int(count)
    return total


def visible_gpus(env: Mapping[str, str]) -> int | None:
    """GPUs granted to this job on this node, from the environment; None when nothing says."""
    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None:
        ids = [d for d in cuda.split(",") if d.strip() and d.strip() != "-1"]
        return len(ids)
    if env.get("SLURM_GPUS_ON_NODE", "").strip().isdigit():
        return int(env["SLURM_GPUS_ON_NODE"])
    if env.get("SLURM_GPUS_PER_NODE"):
        count = _count_gpu_spec(env["SLURM_GPUS_PER_NODE"])
        if count is not None:
            return count
    for key in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if env.get(key):
            return len([d for d in env[key].split(",") if d.strip()])
    return None


def _positive_int(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def job_cpus(env: Mapping[str, str], available: int | None = None) -> int:
    """CPUs this job has on this node.

    SLURM's allocation when it says (``SLURM_CPUS_PER_TASK``; else ``SLURM_CPUS_PER_GPU`` x the
    node's GPUs), else Snakemake's ``threads`` (which it exports as ``OMP_NUM_THREADS`` to every
    job), capped by ``available``: the CPUs this process may run on (its affinity mask, which
    cgroups and SLURM's binding narrow), read from the OS when not given.
    """
    available = _available(available)
    per_gpu, gpus = _positive_int(env, "SLURM_CPUS_PER_GPU"), visible_gpus(env)
    for granted in (
        _positive_int(env, "SLURM_CPUS_PER_TASK"),
        per_gpu * gpus if per_gpu and gpus else None,
        _positive_int(env, "OMP_NUM_THREADS"),
    ):
        if granted is not None:
            return max(1, min(granted, available))
    return max(1, available)


def cpus_per_process(env: Mapping[str, str], available: int | None = None) -> int:
    """The CPUs of this process: its claimed share (:func:`claim_process_cpus`) once a training
    rank has claimed it, else :func:`job_cpus` shared among the processes a launcher started on
    this node."""
    claimed = _positive_int(env, PROCESS_CPUS)
    if claimed is not None:
        return claimed
    return max(1, job_cpus(env, available) // local_processes(env))


def _available(available: int | None) -> int:
    """``available``, else the CPUs this process may run on (its affinity mask, which cgroups and
    SLURM's binding narrow)."""
    if available is not None:
        return available
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def local_processes(env: Mapping[str, str]) -> int:
    """Processes a launcher started on this node (torchrun's ``LOCAL_WORLD_SIZE``; 1 without one)."""
    return _positive_int(env, "LOCAL_WORLD_SIZE") or 1


def process_cpus(threads: int | None, env: Mapping[str, str], available: int | None = None) -> int | None:
    """This process's share: ``threads`` (the stage's ``--threads``, the rule's threads) or, without
    it, :func:`job_cpus`, capped by the CPUs this process may run on and divided by
    :func:`local_processes`::

        share = max(1, min(threads or job_cpus, available) // local processes)

    None for one process without ``--threads`` (torch keeps its own default, as it always did).
    """
    ranks = local_processes(env)
    if threads is None:
        return None if ranks == 1 else max(1, job_cpus(env, available) // ranks)
    assert threads >= 1, f"--threads must be >= 1, got {threads}"
    return max(1, min(threads, _available(available)) // ranks)


def claim_process_cpus(
    threads: int | None, env: MutableMapping[str, str] | None = None, available: int | None = None
) -> int | None:
    """:func:`process_cpus`, exported as ``OMP_NUM_THREADS`` and ``AGENTRL_PROCESS_CPUS`` (see the
    module notes); returns it for ``torch.set_num_threads`` (None: nothing to set)."""
    env = os.environ if env is None else env
    share = process_cpus(threads, env, available)
    if share is not None:
        env["OMP_NUM_THREADS"] = env[PROCESS_CPUS] = str(share)
    return share


def set_torch_threads(threads: int | None) -> None:
    """Use the CPU threads the job was given (Snakemake's ``threads``): more intra-op threads
    than cores makes every small matmul of CPU decoding several times slower under load."""
    if threads is not None:
        import torch

        assert threads >= 1, f"--threads must be >= 1, got {threads}"
        torch.set_num_threads(threads)
