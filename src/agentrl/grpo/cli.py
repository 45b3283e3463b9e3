"""``python -m agentrl grpo``: GRPO-TCR training of the SFT model on the filtered RL set (DeepSpeed).

Reads the initial policy (``--model``, the SFT model), the RL problems (``--train``,
``results/filter/rl_train.parquet``) and the validation sets (``--eval``, one parquet per set);
writes the final policy to ``--out`` as a Hugging Face folder, one JSON line of metrics per step
to ``--metrics`` and resumable checkpoints to ``--checkpoint-dir``: a rerun of the same command
continues after the newest checkpoint.

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
from agentrl.data.records import read_problems
from agentrl.launch import relaunch_if_needed
from agentrl.model.folder import check_model_folder
from agentrl.paths import check_writable

log = logging.getLogger("agentrl.grpo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl grpo", description=__doc__, formatter_class=HelpFormatter)
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
    parser.add_argument("--out", type=Path, required=True, help="final policy: Hugging Face folder")
    parser.add_argument("--metrics", type=Path, required=True, help="metrics, one JSON line per step")
    parser.add_argument(
        "--checkpoint-dir", type=Path, required=True, help="checkpoints; a rerun resumes from the newest one"
    )
    parser.add_argument(
        "--deepspeed-config",
        type=Path,
        default=None,
        help="DeepSpeed JSON (default: configs/deepspeed/zero<grpo.deepspeed.zero_stage>.json)",
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
        from agentrl.grpo.runner import check_config
        from agentrl.grpo.variants import resolve_algorithm
        from agentrl.tracking import check_tracking

        check_config(cfg)
        resolve_algorithm(cfg.grpo)
        check_tracking(cfg.tracking)
    except ConfigError as exc:
        parser.error(str(exc))
    # Every input and output checked before DeepSpeed starts and long before the first rollout.
    check_writable((args.out, "--out"), (args.metrics, "--metrics"), (args.checkpoint_dir, "--checkpoint-dir"))
    check_model_folder(args.model, "--model")
    for problems in (args.train, *args.eval):
        read_problems(problems)

    try:
        relaunch_if_needed("grpo", argv, args.nproc)
    except ValueError as exc:
        parser.error(str(exc))

    import deepspeed

    from agentrl.grpo.runner import GrpoPaths, train
    from agentrl.training.deepspeed_engine import find_deepspeed_config
    from agentrl.training.folder_lock import CheckpointFolderInUse
    from agentrl.training.preemption import EXIT_CODE, StoppedForRetry
    from agentrl.training.threads import set_torch_threads

    deepspeed.utils.logger.setLevel(logging.WARNING)
    set_torch_threads(args.threads)
    paths = GrpoPaths(
        model=args.model,
        train=args.train,
        eval_sets=tuple(args.eval),
        out=args.out,
        metrics=args.metrics,
        checkpoints=args.checkpoint_dir,
        deepspeed_config=args.deepspeed_config or find_deepspeed_config(cfg.grpo.deepspeed.zero_stage),
    )
    try:
        train(cfg, paths)
    except StoppedForRetry as stopped:
        log.warning("%s", stopped)
        return EXIT_CODE
    except CheckpointFolderInUse as busy:
        log.error("%s", busy)
        return 1
    return 0
