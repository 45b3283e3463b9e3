"""The model stages' command lines.

- ``python -m agentrl base-model`` (:func:`main`): build the embedded tiny model, or resolve a hub
  id / local folder;
- ``python -m agentrl fetch-model`` (:func:`fetch_main`): link a local model folder or download a
  hub model at a revision. What the workflow runs instead of training when ``sft.from`` names a
  released SFT model, and for each ``eval.checkpoints`` entry given as ``{id, revision}``
  (rules/model.smk). The output folder links the model's files and holds its config.json, stamped
  with the model's digest and its source (:func:`agentrl.model.folder.resolve_pretrained`);
  nothing else is read or written.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

from agentrl.config import add_config_arguments, config_from_args
from agentrl.data.prompts import CODE_INTERPRETER_TOOL
from agentrl.data.records import read_problems, read_sft_examples
from agentrl.hub import check_sources
from agentrl.paths import check_writable
from agentrl.stage_cli import setup_logging, stage_parser

log = logging.getLogger("agentrl.base_model")


def embedded_corpus(sft_path: Path, rl_pool_path: Path, tool_header: str) -> Iterator[str]:
    """Text the tokenizer learns from: rendered SFT conversations and RL prompts (never eval sets)."""
    from agentrl.model.build import train_tokenizer

    # The template is plain Jinja: any tokenizer carrying it renders the same text, so a
    # throwaway one renders the corpus that the real tokenizer is then trained on.
    renderer = train_tokenizer(["0123456789"], 300, tool_header)
    for example in read_sft_examples(sft_path):
        yield renderer.apply_chat_template(example.messages, tools=example.tools, tokenize=False)
    for problem in read_problems(rl_pool_path):
        yield renderer.apply_chat_template(
            problem.prompt, tools=[CODE_INTERPRETER_TOOL], tokenize=False, add_generation_prompt=True
        )


def main(argv: list[str]) -> int:
    parser = stage_parser("base-model", "build the embedded tiny model, or resolve a hub id / local folder")
    add_config_arguments(parser)
    parser.add_argument("--sft", type=Path, help="normalized SFT parquet (tokenizer corpus; embedded only)")
    parser.add_argument("--rl-pool", type=Path, help="normalized RL-pool parquet (tokenizer corpus; embedded only)")
    parser.add_argument("--out", type=Path, required=True, help="output Hugging Face model folder")
    args = parser.parse_args(argv)
    setup_logging()
    cfg = config_from_args(args)
    check_writable((args.out, "--out", "folder"))
    check_sources(cfg)

    from agentrl.model import build

    if cfg.model.base == "embedded":
        if not (args.sft and args.rl_pool):
            parser.error("the embedded model needs --sft and --rl-pool (its tokenizer is trained on them)")
        corpus = embedded_corpus(args.sft, args.rl_pool, cfg.model.embedded.tool_header)
        build.save_embedded_model(corpus, cfg.model.embedded, cfg.seed, args.out)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.out)
        log.info(
            "embedded Qwen3: %d parameters, vocab %d -> %s",
            build.count_parameters(model),
            model.config.vocab_size,
            args.out,
        )
    else:
        build.resolve_pretrained(cfg.model.base, args.out, cfg.model.revision)
        log.info("model.base %s -> %s", cfg.model.base, args.out)
    return 0


def fetch_main(argv: list[str]) -> int:
    parser = stage_parser("fetch-model", "link a local model folder or download a hub model at a revision")
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
    logging.getLogger("agentrl.fetch_model").info("%s: %s -> %s", args.key, source, out)
    return 0
