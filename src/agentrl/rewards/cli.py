"""``python -m agentrl reward``: score one response and print the :class:`RewardResult` as JSON.

    python -m agentrl reward --data-source AIME2024 --ground-truth 204 --response-file out.txt \\
        [--response-length 18000] [--num-tool-calls 3] [--config config.yaml | --config-json '{...}']

A code ground truth is the row's JSON (``{"inputs": [...], "outputs": [...]}`` ...), given
inline or with ``--ground-truth-file``. The sandbox is built (from the config's ``sandbox``
section) only when the data source is a code source. Exit status 0 on success, 2 on bad input
(unknown data source, malformed ground truth, missing file, invalid config).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agentrl.config import ConfigError, add_config_arguments, config_from_args
from agentrl.data.records import Problem
from agentrl.rewards.base import InvalidGroundTruthError
from agentrl.rewards.registry import UnknownDataSourceError, family_of
from agentrl.rewards.reward_function import RewardFunction
from agentrl.stage_cli import read_text, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("reward", __doc__.split("\n")[0])
    parser.add_argument("--data-source", required=True, help="e.g. AIME2024, gpqa_diamond, LiveCodeBench_v6")
    truth = parser.add_mutually_exclusive_group(required=True)
    truth.add_argument("--ground-truth", help="answer string, or the JSON of a code row's tests")
    truth.add_argument("--ground-truth-file", type=Path, help="file holding the ground truth")
    parser.add_argument("--response-file", required=True, help="file with the response text ('-' = stdin)")
    parser.add_argument(
        "--response-length",
        type=int,
        default=0,
        help="response length in tokens, tool tokens included, for the overlong penalty (default 0: no penalty)",
    )
    parser.add_argument("--num-tool-calls", type=int, default=0, help="executed tool calls, for tool-call shaping")
    add_config_arguments(parser)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    sandbox = None
    try:
        cfg = config_from_args(args)
        response = read_text(args.response_file, "--response-file")
        ground_truth = (
            args.ground_truth
            if args.ground_truth is not None
            else read_text(args.ground_truth_file, "--ground-truth-file").strip()
        )
        if family_of(args.data_source, cfg.reward.unknown_source) == "code":
            from agentrl.tools.factory import make_sandbox  # only code needs it

            sandbox = make_sandbox(cfg.sandbox)
        problem = Problem(id="cli", data_source=args.data_source, prompt=[], ability="", ground_truth=ground_truth)
        result = RewardFunction(cfg.reward, sandbox).score(
            problem, response, response_length=args.response_length, num_tool_calls=args.num_tool_calls
        )
    except (ConfigError, UnknownDataSourceError, InvalidGroundTruthError, FileNotFoundError, ValueError) as exc:
        print(f"agentrl reward: {exc}", file=sys.stderr)
        return 2
    finally:
        if sandbox is not None:
            sandbox.close()
    print(json.dumps(result.to_json(), ensure_ascii=False, indent=2))
    return 0
