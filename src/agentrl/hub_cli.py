"""``python -m agentrl hub-download``: fill the local hub cache with what the config reads (:mod:`agentrl.hub`)."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.config import add_config_arguments, config_from_args
from agentrl.stage_cli import setup_logging, stage_parser


def main(argv: list[str]) -> int:
    parser = stage_parser(
        "hub-download", "Download the hub data sets and base model the config names into the local hub cache."
    )
    add_config_arguments(parser)
    parser.add_argument("--manifest", type=Path, required=True, help="output: JSON of what was fetched, by config key")
    args = parser.parse_args(argv)
    setup_logging()
    from agentrl.hub import download

    manifest = download(config_from_args(args))
    args.manifest.parent.mkdir(parents=True, exist_ok=True)
    args.manifest.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return 0
