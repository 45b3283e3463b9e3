"""``python -m agentrl sandbox [--timeout S] [--memory-mb M] [--stdin FILE] FILE|-``.

Runs one Python file (``-``: standard input) in the configured sandbox (``sandbox`` section of
``--config``/``--config-json``; one worker) and prints the :class:`ExecutionResult` as one JSON
object. Exit status: 0 when the code ran and exited 0, 1 when it did not (error, timeout,
killed), 2 for bad arguments or a sandbox that cannot start.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from agentrl.config import ConfigError, add_config_arguments, config_from_args
from agentrl.stage_cli import read_text, stage_parser
from agentrl.tools.factory import make_sandbox
from agentrl.tools.sandbox import SandboxUnavailableError


def _parser() -> argparse.ArgumentParser:
    parser = stage_parser("sandbox", __doc__.split("\n\n")[1])
    parser.add_argument("file", help="Python file to run, or - for standard input")
    parser.add_argument("--timeout", type=float, help="wall-clock limit in seconds (default: sandbox.timeout_s)")
    parser.add_argument("--memory-mb", type=int, help="memory limit in MB (default: sandbox.memory_mb)")
    parser.add_argument("--stdin", type=Path, help="file whose content is the program's standard input")
    add_config_arguments(parser)
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.timeout is not None and not args.timeout > 0:
        parser.error(f"--timeout must be > 0, got {args.timeout}")
    if args.memory_mb is not None and args.memory_mb < 16:
        parser.error(f"--memory-mb must be >= 16, got {args.memory_mb}")
    try:
        sandbox_cfg = config_from_args(args).sandbox
        code = read_text(args.file, "the program")
        stdin = read_text(args.stdin, "the stdin file") if args.stdin is not None else None
    except ConfigError as exc:
        print(f"agentrl sandbox: {exc}", file=sys.stderr)
        return 2
    # One execution gains nothing from preloaded modules: it would pay for them anyway.
    overrides = {"workers": 1, "preload_modules": ()}
    if args.memory_mb is not None:
        overrides["memory_mb"] = args.memory_mb
    sandbox_cfg = dataclasses.replace(sandbox_cfg, **overrides)
    try:
        with make_sandbox(sandbox_cfg) as sandbox:
            result = sandbox.run(code, stdin=stdin, timeout_s=args.timeout)
    except SandboxUnavailableError as exc:
        print(f"agentrl sandbox: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json(), ensure_ascii=False))
    return 0 if result.status == "ok" else 1
