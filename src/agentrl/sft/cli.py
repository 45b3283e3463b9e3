"""``python -m agentrl sft``: supervised fine-tuning on multi-turn tool-use trajectories (DeepSpeed).

Reads the normalized SFT parquet, trains the model in ``--model``, writes the fine-tuned model to
``--out`` as a Hugging Face folder (safetensors, tokenizer, chat template), one JSON line of
metrics per optimizer step to ``--metrics``, and resumable checkpoints to ``--checkpoint-dir``.

``--recipe pretrain`` runs the embedded base model's copying pretraining instead
(:mod:`agentrl.sft.pretrain`): the same trainer, with ``model.embedded.pretrain``'s epochs, batch,
lr and warmup in place of SFT's, on the ``copy-corpus`` parquet.

``--nproc N`` (or ``auto``: the GPUs the scheduler granted) processes per node: when more than
one process is needed and none is running yet, the command re-executes itself through torchrun
(and srun on multi-node SLURM jobs); see :mod:`agentrl.training.launch`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from agentrl.config import add_config_arguments
from agentrl.data.records import read_sft_examples
from agentrl.model.folder import check_model_folder
from agentrl.paths import check_writable
from agentrl.stage_cli import config_or_exit, setup_logging, stage_parser
from agentrl.tracking import check_tracking
from agentrl.training.cli import add_training_arguments, deepspeed_config, launch, run_trainer

log = logging.getLogger("agentrl.sft")


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("sft", __doc__)
    add_config_arguments(parser)
    parser.add_argument("--model", type=Path, required=True, help="base model: Hugging Face folder")
    parser.add_argument("--data", type=Path, required=True, help="normalized SFT parquet (agentrl.data.records)")
    parser.add_argument(
        "--recipe",
        choices=["sft", "pretrain"],
        default="sft",
        help="sft (the sft section) or pretrain (model.embedded.pretrain's recipe keys in place of sft's)",
    )
    add_training_arguments(parser, "sft")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    cfg = config_or_exit(parser, args, lambda cfg: check_tracking(cfg.tracking))  # before launching any process
    # Every input and output checked before DeepSpeed starts and long before the first step.
    check_writable(
        (args.out, "--out", "folder"),
        (args.metrics, "--metrics", "file"),
        (args.checkpoint_dir, "--checkpoint-dir", "folder"),
    )
    check_model_folder(args.model, "--model")
    from agentrl.training.checkpoint_files import choose_checkpoint
    from agentrl.training.deepspeed_engine import load_deepspeed_config

    choose_checkpoint(args.checkpoint_dir, repair=False)  # no intact checkpoint among some: refused here

    load_deepspeed_config(deepspeed_config(args, cfg.sft.deepspeed.zero_stage), cfg.sft.deepspeed.zero_stage)
    read_sft_examples(args.data)
    launch(parser, "sft", argv, args)

    from agentrl.sft.pretrain import pretrain_sft_config
    from agentrl.sft.trainer import SftPaths, train_sft

    paths = SftPaths(
        model_dir=args.model,
        data=args.data,
        out_dir=args.out,
        metrics=args.metrics,
        checkpoint_dir=args.checkpoint_dir,
        deepspeed_config=deepspeed_config(args, cfg.sft.deepspeed.zero_stage),
    )
    recipe = cfg.sft if args.recipe == "sft" else pretrain_sft_config(cfg.model.embedded.pretrain, cfg.sft)
    return run_trainer(lambda: train_sft(recipe, cfg.seed, paths, cfg.tracking, stage=args.recipe), log)
