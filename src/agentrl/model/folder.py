"""Model folders as Snakemake tracks them: ``config.json`` carries a digest of the model's files.

Every rule that reads a model names its ``config.json`` as the input (a folder cannot be an input
whose changes Snakemake sees). Since Snakemake 9.18 an input whose content checksum is unchanged
does not re-run its consumers, even when it is newer than their outputs, and a retrained model's
``config.json`` is byte-identical to the old one: after ``sft`` re-ran, ``evaluate`` for the SFT
model was silently skipped. So each stage that writes a model stamps ``config.json`` with the
SHA-256 of the files that define it besides the config: the weights, the tokenizer and the
generation config (key :data:`MODEL_DIGEST_KEY`). The tokenizer counts because the embedded base
model's weights depend only on the seed: new data trains a new tokenizer into a base model with
byte-identical weights, and its consumers must re-run all the same. New files give a new
``config.json`` and every consumer re-runs; an unchanged model keeps its checksum. Transformers
and vLLM load the key as an inert config attribute.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MODEL_DIGEST_KEY = "agentrl_model_sha256"
# Hugging Face weight files only: a GRPO checkpoint folder also holds DeepSpeed states (*.pt),
# which are not the model and can be many times its size.
WEIGHT_SUFFIXES = (".safetensors", ".bin")
# The tokenizer and generation files transformers writes beside the weights.
MODEL_FILE_NAMES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "merges.txt",
        "tokenizer.model",
        "chat_template.jinja",
        "chat_template.json",
        "generation_config.json",
    }
)


def model_digest(folder: str | Path) -> str:
    """SHA-256 over the weight, tokenizer and generation files of ``folder``: each file's name,
    then its bytes, in name order."""
    folder = Path(folder)
    entries = [p for p in folder.iterdir() if p.is_file()]
    if not any(p.name.endswith(WEIGHT_SUFFIXES) for p in entries):
        raise FileNotFoundError(f"{folder}: no weight files ({', '.join('*' + s for s in WEIGHT_SUFFIXES)})")
    files = sorted(p for p in entries if p.name.endswith(WEIGHT_SUFFIXES) or p.name in MODEL_FILE_NAMES)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()


def stamp_model_digest(folder: str | Path) -> str:
    """Write :func:`model_digest` into ``folder/config.json`` (atomically) and return it."""
    folder = Path(folder)
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{folder}: no config.json; is it a Hugging Face model folder?") from None
    config.pop("agentrl_weights_sha256", None)  # the key of earlier versions (weights only)
    config[MODEL_DIGEST_KEY] = model_digest(folder)
    tmp = config_path.with_name(config_path.name + ".tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, config_path)
    return config[MODEL_DIGEST_KEY]
