"""``python -m agentrl grpo``: GRPO-TCR training of the SFT model on the filtered RL set (DeepSpeed).

Reads the initial policy (``--model``, the SFT model), the RL problems (``--train``,
``results/filter/rl_train.parquet``) and the validation sets (``--eval``, one parquet per set);
writes the final policy to ``--out`` as a Hugging Face folder, one JSON line of metrics per step
to ``--metrics`` and resumable checkpoints to ``--checkpoint-dir``: a rerun of the same command
continues after the newest checkpoint.

``--nproc N`` (or ``auto``: the GPUs the scheduler granted) processes per node: when more than
one process is needed and none is running yet, the command re-executes itself through torchrun
(and srun on multi-node SLURM jobs); see :mod:`agentrl.training.launch`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from agentrl.config import Config, add_config_arguments
from agentrl.model.folder import check_model_folder
from agentrl.paths import check_writable
from agentrl.rewards.ground_truth import read_gradable_problems
from agentrl.stage_cli import config_or_exit, setup_logging, stage_parser
from agentrl.training.cli import add_training_arguments, deepspeed_config, launch, run_trainer

log = logging.getLogger("agentrl.grpo")


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("grpo", __doc__)
    add_config_arguments(parser)
    parser.add_argument("--model", type=Path, required=True, help="initial policy (the SFT model): Hugging Face folder")
    parser.add_argument("--train", type=Path, required=True, help="RL problems (results/filter/rl_train.parquet)")
    parser.add_argument(
        "--eval",
        type=Path,
        nargs="*",
        default=[],
        help="validation sets, one normalized problem parquet each (named by file stem)",
    )
    add_training_arguments(parser, "grpo")
    return parser


def _check(cfg: Config) -> None:
    from agentrl.grpo.trainer import check_config
    from agentrl.grpo.variants import resolve_algorithm
    from agentrl.tracking import check_tracking

    check_config(cfg)
    resolve_algorithm(cfg.grpo)
    check_tracking(cfg.tracking)


def trainer_nproc(cfg: Config, nproc: str) -> str:
    """``--nproc`` for the trainer: on GPUs, the node's less the rollout process's under
    ``grpo.placement: separate`` (:func:`agentrl.config.trainer_processes`); on CPU
    (no CUDA device) the processes asked for."""
    import os

    import torch

    from agentrl.config import trainer_processes
    from agentrl.cpus import visible_gpus

    if not torch.cuda.is_available():
        return nproc
    text = str(nproc).strip().lower()
    if text == "auto":
        gpus = visible_gpus(os.environ) or 0
    elif text.isdigit():
        gpus = int(text)
    else:
        return nproc  # launch() reports it
    return str(trainer_processes(cfg.grpo, gpus)) if gpus > 0 else nproc


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    cfg = config_or_exit(parser, args, _check)  # validate before launching any process
    # Every input and output checked before DeepSpeed starts and long before the first rollout.
    check_writable(
        (args.out, "--out", "folder"),
        (args.metrics, "--metrics", "file"),
        (args.checkpoint_dir, "--checkpoint-dir", "folder"),
    )
    check_model_folder(args.model, "--model")
    from agentrl.training.checkpoint_files import choose_checkpoint
    from agentrl.training.deepspeed_engine import load_deepspeed_config

    choose_checkpoint(args.checkpoint_dir, repair=False)  # no intact checkpoint among some: refused here

    load_deepspeed_config(deepspeed_config(args, cfg.grpo.deepspeed.zero_stage), cfg.grpo.deepspeed.zero_stage)
    for problems in (args.train, *args.eval):
        read_gradable_problems(problems)
    args.nproc = trainer_nproc(cfg, args.nproc)
    launch(parser, "grpo", argv, args)

    from agentrl.grpo.trainer import GrpoPaths, train

    paths = GrpoPaths(
        model=args.model,
        train=args.train,
        eval_sets=tuple(args.eval),
        out=args.out,
        metrics=args.metrics,
        checkpoints=args.checkpoint_dir,
        deepspeed_config=deepspeed_config(args, cfg.grpo.deepspeed.zero_stage),
    )
    return run_trainer(lambda: train(cfg, paths), log)
