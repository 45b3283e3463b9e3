"""``python -m agentrl sft``: supervised fine-tuning on multi-turn tool-use trajectories (DeepSpeed).

Reads the normalized SFT parquet, trains the model in ``--model``, writes the fine-tuned model to
``--out`` as a Hugging Face folder (safetensors, tokenizer, chat template), one JSON line of
metrics per optimizer step to ``--metrics``, and resumable checkpoints to ``--checkpoint-dir``.

``--nproc N`` (or ``auto``: the GPUs the scheduler granted) processes per node: when more than
one process is needed and none is running yet, the command re-executes itself through torchrun
(and srun on multi-node SLURM jobs); see :mod:`agentrl.launch`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from agentrl.cli_help import HelpFormatter
from agentrl.config import ConfigError, add_config_arguments, config_from_args
from agentrl.data.records import read_sft_examples
from agentrl.launch import relaunch_if_needed
from agentrl.model.folder import check_model_folder
from agentrl.paths import check_writable
from agentrl.tracking import check_tracking

log = logging.getLogger("agentrl.sft")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl sft", description=__doc__, formatter_class=HelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--model", type=Path, required=True, help="base model: Hugging Face folder")
    parser.add_argument("--data", type=Path, required=True, help="normalized SFT parquet (agentrl.data.records)")
    parser.add_argument("--out", type=Path, required=True, help="output Hugging Face model folder")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics, one JSON line per optimizer step")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        required=True,
        help="DeepSpeed checkpoints; a rerun resumes from the newest one made by the same setup",
    )
    parser.add_argument(
        "--deepspeed-config",
        type=Path,
        default=None,
        help="DeepSpeed JSON (default: configs/deepspeed/zero<sft.deepspeed.zero_stage>.json)",
    )
    parser.add_argument(
        "--nproc",
        default="auto",
        help="processes per node: a number (0 = one CPU process) or auto (GPUs granted, else 1)",
    )
    parser.add_argument("--threads", type=int, help="CPU threads for torch per process (the rule's threads)")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        cfg = config_from_args(args)  # validate before launching any process
        check_tracking(cfg.tracking)
    except ConfigError as exc:
        parser.error(str(exc))
    # Every input and output checked before DeepSpeed starts and long before the first step.
    check_writable((args.out, "--out"), (args.metrics, "--metrics"), (args.checkpoint_dir, "--checkpoint-dir"))
    check_model_folder(args.model, "--model")
    read_sft_examples(args.data)

    try:
        relaunch_if_needed("sft", argv, args.nproc)
    except ValueError as exc:
        parser.error(str(exc))

    from agentrl.training.deepspeed_engine import find_deepspeed_config
    from agentrl.training.folder_lock import CheckpointFolderInUse
    from agentrl.training.preemption import EXIT_CODE, StoppedForRetry
    from agentrl.training.threads import set_torch_threads

    set_torch_threads(args.threads)
    from agentrl.sft.trainer import SftPaths, train_sft

    deepspeed_config = args.deepspeed_config or find_deepspeed_config(cfg.sft.deepspeed.zero_stage)
    paths = SftPaths(
        model_dir=args.model,
        data=args.data,
        out_dir=args.out,
        metrics=args.metrics,
        checkpoint_dir=args.checkpoint_dir,
        deepspeed_config=deepspeed_config,
    )
    try:
        train_sft(cfg.sft, cfg.seed, paths, cfg.tracking)
    except StoppedForRetry as stopped:
        log.warning("%s", stopped)
        return EXIT_CODE
    except CheckpointFolderInUse as busy:
        log.error("%s", busy)
        return 1
    return 0
