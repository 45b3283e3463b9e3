"""What every stage CLI shares: its parser, its logging, reading an input file or stdin.

Each ``agentrl <stage>`` module builds its parser with :func:`stage_parser` (help texts without
markup, :mod:`agentrl.cli_help`) and its subcommands with :func:`add_command`, calls :func:`setup_logging` once after parsing, and reads
text inputs with :func:`read_text`, so every stage reports an unreadable input the same way.
The training stages' shared arguments and launch are :mod:`agentrl.training.cli`'s.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.cli_help import HelpFormatter
from agentrl.config import Config, ConfigError, add_config_arguments, config_from_args

LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"


def stage_parser(stage: str, description: str | None) -> argparse.ArgumentParser:
    """The parser of ``agentrl <stage>``; ``description`` is usually the module docstring."""
    return argparse.ArgumentParser(prog=f"agentrl {stage}", description=description, formatter_class=HelpFormatter)


def add_command(
    commands: argparse._SubParsersAction, name: str, help: str, *, config: bool = True
) -> argparse.ArgumentParser:
    """The subcommand ``name`` of a stage (``agentrl filter score``) with the stage parser's help
    formatting (a subparser does not inherit it) and, unless ``config=False``, the config arguments."""
    parser = commands.add_parser(name, help=help, formatter_class=HelpFormatter)
    if config:
        add_config_arguments(parser)
    return parser


def setup_logging() -> None:
    """INFO lines with time and logger name on stderr (Snakemake redirects them to the job log).

    When stderr is not a terminal (a job log), the Hugging Face libraries' own bars ("Loading
    weights", downloads) are turned off: in a file they are carriage-return streams. The stages'
    progress lines (:mod:`agentrl.progress`) say the same in plain lines.
    """
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    if not sys.stderr.isatty():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when transformers is imported
        if "transformers" in sys.modules:
            sys.modules["transformers"].utils.logging.disable_progress_bar()


def read_text(path: str | Path, what: str) -> str:
    """The text of ``path`` (``-``: standard input); a file that cannot be read is a
    :class:`~agentrl.config.ConfigError` naming ``what`` (the option) and the path."""
    if str(path) == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path}: not UTF-8 text (byte {exc.start})") from None


def config_or_exit(
    parser: argparse.ArgumentParser, args: argparse.Namespace, *checks: Callable[[Config], Any]
) -> Config:
    """The validated config of ``--config``/``--config-json`` and the stage's own ``checks``;
    a :class:`~agentrl.config.ConfigError` exits with the short message and status 2."""
    try:
        cfg = config_from_args(args)
        for check in checks:
            check(cfg)
    except ConfigError as exc:
        parser.error(str(exc))
    return cfg


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer ``>= minimum``, else argparse's usage error naming the option."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse
