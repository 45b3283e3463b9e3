"""``python -m agentrl fetch-model``: link a local model folder or download a hub model at a revision.

What the workflow runs instead of training when ``sft.from`` names a released SFT model, and
for each ``eval.checkpoints`` entry given as ``{id, revision}`` (rules/model.smk). The output
folder links the model's files and holds its config.json, stamped with the model's digest and
its source (:func:`agentrl.model.folder.resolve_pretrained`); nothing else is read or written.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from agentrl.stage_cli import setup_logging, stage_parser

log = logging.getLogger("agentrl.fetch_model")


def main(argv: list[str]) -> int:
    parser = stage_parser("fetch-model", __doc__)
    parser.add_argument("--id", required=True, help="hub model id 'org/name', or a local Hugging Face model folder")
    parser.add_argument("--revision", help="hub branch, tag or commit (default: the hub's main); not for a folder")
    parser.add_argument("--key", default="--id", help="the config key that named the model (for errors)")
    parser.add_argument("--out", type=Path, required=True, help="output model folder")
    args = parser.parse_args(argv)
    setup_logging()
    from agentrl.hub_ids import refuse_path_typos
    from agentrl.model.folder import MODEL_SOURCE_KEY, resolve_pretrained

    refuse_path_typos([(args.key, args.id)])

    out = resolve_pretrained(args.id, args.out, revision=args.revision or None, key=args.key)
    source = json.loads((out / "config.json").read_text())[MODEL_SOURCE_KEY]
    log.info("%s: %s -> %s", args.key, source, out)
    return 0
