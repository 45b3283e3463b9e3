"""``python -m agentrl <stage> ...``: one entry point, one module per stage.

Stage modules are imported lazily so that ``agentrl sandbox`` does not pay for importing
torch, and so that a stage whose optional dependency is missing does not break the others.
Each stage's entry is a function ``(argv: list[str]) -> int`` of a ``cli`` module (:class:`Stage`). A :class:`agentrl.errors.UserInputError`
(a bad config key, data row, model folder or output path) is printed as one message, exit status
2, without a traceback; a :class:`agentrl.errors.StageInterrupted` (a shard job stopped by a
signal or its parent's exit, or waiting on another writer) as one line with its own exit status.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import NamedTuple

from agentrl import __version__
from agentrl.errors import StageInterrupted, UserInputError


class Stage(NamedTuple):
    """Where a stage's command line lives: ``<module>.<entry>(argv) -> int``, always a ``cli`` module."""

    module: str
    help: str
    entry: str = "main"


STAGES: dict[str, Stage] = {
    "hub-download": Stage("agentrl.hub_cli", "fetch the hub data sets and base model into the local hub cache"),
    "prepare-data": Stage("agentrl.data.cli", "write the normalized SFT, RL-pool and eval parquet files"),
    "fit-prompts": Stage(
        "agentrl.data.cli", "drop prompts over the token limits, counted per data source", "fit_prompts_main"
    ),
    "copy-corpus": Stage(
        "agentrl.data.cli",
        "write the copying conversations the embedded base model is pretrained on",
        "copy_corpus_main",
    ),
    "base-model": Stage("agentrl.model.cli", "build the embedded tiny model or resolve a hub id / path"),
    "fetch-model": Stage(
        "agentrl.model.cli", "link a local model folder or download a hub model at a revision", "fetch_main"
    ),
    "sandbox": Stage("agentrl.tools.cli", "run a Python file in the sandbox and print the result as JSON"),
    "reward": Stage("agentrl.rewards.cli", "score one response with the reward registry"),
    "rollout": Stage("agentrl.rollout.cli", "multi-turn agentic rollouts of a model on a problem file"),
    "sft": Stage("agentrl.sft.cli", "supervised fine-tuning on multi-turn tool-use trajectories"),
    "filter": Stage("agentrl.filtering.cli", "model-aware RL data filtering (score | select)"),
    "grpo": Stage("agentrl.grpo.cli", "GRPO-TCR training"),
    "evaluate": Stage("agentrl.evaluation.cli", "benchmark evaluation of one model"),
    "report": Stage("agentrl.report.cli", "tables and plots of the whole run"),
}


def _usage() -> str:
    width = max(len(name) for name in STAGES)
    lines = ["usage: python -m agentrl <stage> [options]   (--version, --help; <stage> --help)", "", "stages:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_, _) in STAGES.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        status = _run(argv)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, as other command-line tools do.
        # Python's own final flush would fail again, so stdout points to /dev/null from here.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status


def _run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"agentrl {__version__}")
        return 0
    stage = argv[0].replace("_", "-")
    if stage not in STAGES:
        print(f"agentrl: unknown stage {argv[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    entry = getattr(importlib.import_module(STAGES[stage].module), STAGES[stage].entry)
    try:
        return int(entry(argv[1:]) or 0)
    except UserInputError as exc:  # the user's to fix: the message names the file, row or key
        print(f"agentrl {stage}: error: {exc}", file=sys.stderr)
        return 2
    except StageInterrupted as exc:  # stopped on purpose, nothing lost: a rerun goes on
        print(f"agentrl {stage}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
