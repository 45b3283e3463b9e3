"""What the ``sft`` and ``grpo`` CLIs share: their training arguments, the launch, the exit codes.

Both take ``--out``, ``--metrics``, ``--checkpoint-dir``, ``--deepspeed-config``, ``--nproc``,
``--nodes`` and ``--threads`` (:func:`add_training_arguments`); both re-execute themselves under torchrun/srun
when one process is not enough (:func:`launch`, :mod:`agentrl.training.launch`); both exit with
:data:`~agentrl.training.preemption.EXIT_CODE` after a stop request and 1 when another trainer
holds the checkpoint folder (:func:`run_trainer`).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def add_training_arguments(parser: argparse.ArgumentParser, section: str) -> None:
    """The output, checkpoint and process arguments of a training stage (config section ``section``)."""
    parser.add_argument("--out", type=Path, required=True, help="the trained model: a Hugging Face folder")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics, one JSON line per training step")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        required=True,
        help="DeepSpeed checkpoints; a rerun resumes from the newest one made by the same setup "
        "(one trainer per folder: a second one refuses)",
    )
    parser.add_argument(
        "--deepspeed-config",
        type=Path,
        default=None,
        help=f"DeepSpeed JSON (default: configs/deepspeed/zero<{section}.deepspeed.zero_stage>.json)",
    )
    parser.add_argument(
        "--nproc",
        default="auto",
        help="processes per node: a number (0 = one CPU process) or auto (GPUs granted, else 1)",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="nodes of a SLURM job, one torchrun each (started with srun; default: the allocation's, else 1)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="the CPU threads of one node of the job (the rule's threads); each of the node's processes gets an "
        "equal share",
    )


def launch(parser: argparse.ArgumentParser, stage: str, argv: Sequence[str], args: argparse.Namespace) -> None:
    """Re-execute under torchrun/srun when ``--nproc`` asks for more processes than this one (does
    not return then); else set this process's share of the job's CPUs as its torch threads and
    ``OMP_NUM_THREADS`` (:func:`agentrl.cpus.claim_process_cpus`), and quiet DeepSpeed's INFO lines.

    CUDA's caching allocator gets expandable segments first (:func:`cuda_allocator_settings`),
    so that torchrun's ranks inherit them.
    """
    import os

    from agentrl.training.launch import relaunch_if_needed

    os.environ.update(cuda_allocator_settings(os.environ))
    try:
        relaunch_if_needed(stage, list(argv), args.nproc, nnodes=args.nodes, threads=args.threads)
    except ValueError as exc:
        parser.error(str(exc))
    import deepspeed

    from agentrl.cpus import claim_process_cpus, set_torch_threads

    deepspeed.utils.logger.setLevel(logging.WARNING)
    set_torch_threads(claim_process_cpus(args.threads))


def cuda_allocator_settings(env: Mapping[str, str]) -> dict[str, str]:
    """``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` unless the environment sets its own.

    A training step allocates tensors of every size (Adam's states appear at the first step, the
    activations of a 20K-token micro-batch come and go), which fragments fixed-size cached
    segments; with a colocated engine asleep the memory it wants back on waking must be free in
    one piece. Expandable segments grow and shrink in place (verl sets the same for its trainers).
    vLLM's sleep-mode pool turns them off for its own allocations and back on after
    (``device_allocator/cumem.py``). Read at CUDA's first allocation: nothing changes on a CPU.
    """
    if "PYTORCH_CUDA_ALLOC_CONF" in env:
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def deepspeed_config(args: argparse.Namespace, zero_stage: int) -> Path:
    """``--deepspeed-config``, else ``configs/deepspeed/zero<zero_stage>.json``."""
    from agentrl.training.deepspeed_engine import find_deepspeed_config

    return args.deepspeed_config or find_deepspeed_config(zero_stage)


def run_trainer(train: Callable[[], Any], log: logging.Logger) -> int:
    """Run ``train``; the stage's exit status: 0, EXIT_CODE after a stop request (the rerun
    resumes), 1 when another trainer holds the checkpoint folder, 2 for an input error found
    once the processes started (batch sizes against the process count).

    After a run that ended the same way on every rank (done, or stopped at a step boundary the
    ranks agreed on) the process group is destroyed before the interpreter exits: gloo's worker
    threads left to interpreter teardown abort the process now and then ("terminate called
    without an active exception", SIGABRT), which fails a finished stage. After an error it is
    left alone, since destroying it while another rank sits in a collective can hang.
    """
    from agentrl.errors import UserInputError
    from agentrl.training.deepspeed_engine import close_distributed
    from agentrl.training.folder_lock import CheckpointFolderInUse
    from agentrl.training.preemption import EXIT_CODE, StoppedForRetry

    try:
        train()
    except StoppedForRetry as stopped:
        log.warning("%s", stopped)
        close_distributed()
        return EXIT_CODE
    except CheckpointFolderInUse as busy:
        log.error("%s", busy)
        return 1
    except UserInputError as exc:  # e.g. a check that needs the process count, known once the ranks started
        log.error("%s", exc)
        return 2
    close_distributed()
    return 0
