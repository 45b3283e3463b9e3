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

A model that is not trained here (``model.base``, ``sft.from``, a released ``eval.checkpoints``
entry) is linked into the stage's folder, never copied: :func:`resolve_pretrained` links a local
folder, or the Hugging Face cache's snapshot of a hub id at a revision, and records the source
(``agentrl_source``: id, revision, the commit it resolved to) beside the digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
from pathlib import Path
from typing import Any

from agentrl.errors import ModelFolderError
from agentrl.hub_ids import fetching

MODEL_DIGEST_KEY = "agentrl_model_sha256"
# Where a linked or downloaded model came from (resolve_pretrained): id, revision asked for, commit.
MODEL_SOURCE_KEY = "agentrl_source"
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
        raise ModelFolderError(f"{folder}: no weight files ({', '.join('*' + s for s in WEIGHT_SUFFIXES)})")
    files = sorted(p for p in entries if p.name.endswith(WEIGHT_SUFFIXES) or p.name in MODEL_FILE_NAMES)
    digest = hashlib.sha256()
    block = memoryview(bytearray(1 << 24))  # one buffer for every read: a trainer's export hashes 8 GB
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            while size := handle.readinto(block):
                digest.update(block[:size])
    return digest.hexdigest()


def stamp_model_digest(folder: str | Path) -> str:
    """Write :func:`model_digest` into ``folder/config.json`` (atomically) and return it."""
    folder = Path(folder)
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ModelFolderError(f"{folder}: no config.json; is it a Hugging Face model folder?") from None
    config.pop("agentrl_weights_sha256", None)  # the key of earlier versions (weights only)
    config[MODEL_DIGEST_KEY] = model_digest(folder)
    tmp = config_path.with_name(config_path.name + ".tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, config_path)
    return config[MODEL_DIGEST_KEY]


def _link_model_folder(source: Path, out_dir: Path) -> None:
    """``out_dir`` := a symlink to each entry of ``source``, except ``config.json``, copied and stamped.

    The model is not copied (a 4B model is 8 GB) and ``source`` is never written to; the stamp
    (:mod:`agentrl.model.folder`) makes another model at the same path re-run its consumers.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    for stale in (tmp, out_dir):
        if stale.is_symlink():
            stale.unlink()
        else:
            shutil.rmtree(stale, ignore_errors=True)
    tmp.mkdir()
    for entry in source.iterdir():
        if entry.name == "config.json":
            shutil.copyfile(entry, tmp / entry.name)
        else:
            os.symlink(entry.resolve(), tmp / entry.name, target_is_directory=entry.is_dir())
    stamp_model_digest(tmp)
    tmp.rename(out_dir)


def is_hub_id(name: str) -> bool:
    """``org/name`` as the hub spells a repository (a path such as ``./a/b`` or ``/a/b`` is not one)."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and all(name.split("/"))


def resolve_pretrained(base: str, out_dir: str | Path, revision: str | None = None, key: str = "model.base") -> Path:
    """Make ``out_dir`` hold the model named by ``base``: a local folder or a hub id at ``revision``.

    A local folder is linked (:func:`_link_model_folder`); a ``revision`` for it is refused, since
    nothing could check it. A hub id is downloaded into the Hugging Face cache
    (``snapshot_download``; ``HF_HUB_OFFLINE=1`` reads a pre-filled cache) and its snapshot folder,
    named by the commit it resolved, is linked the same way. ``config.json`` records the source
    under ``agentrl_source`` (id, revision asked for, commit), so a run states which commit it used.
    ``key`` names the config key in error messages.
    """
    out_dir = Path(out_dir)
    source = Path(base).expanduser()
    if source.is_dir():
        if revision is not None:
            raise ModelFolderError(f"{key}={base!r} is a local folder: a revision ({revision!r}) pins a hub id only")
        check_model_folder(source, key)  # config.json, weights and tokenizer: the stages after it read all three
        record = {"id": str(source.resolve()), "revision": None, "commit": None}
        source = source.resolve()
    elif is_hub_id(base) and source.parent.is_dir():
        # "results/base" with results/ present is a local folder that is missing, not a hub repository.
        raise ModelFolderError(
            f"{key}={base!r}: no such folder ({source.parent} exists, so it is read as a local path, not a hub id)"
        )
    elif is_hub_id(base):
        source = _download_snapshot(base, revision, key)
        check_model_folder(source, f"{key}={base!r} (hub snapshot)")  # a hub repository can lack a chat template too
        record = {"id": base, "revision": revision, "commit": source.name}
    else:
        raise ModelFolderError(f"{key}={base!r} is neither an existing folder nor a hub id 'org/name'")
    _link_model_folder(source, out_dir)
    _record_source(out_dir, record)
    return out_dir


def _download_snapshot(repo_id: str, revision: str | None, key: str) -> Path:
    """The hub snapshot folder of ``repo_id`` at ``revision``; a repository or revision the hub
    (or, offline, the local cache) does not have is the user's to fix: one line naming the key
    (:func:`agentrl.hub_ids.hub_fetch_refusal`)."""
    from huggingface_hub import snapshot_download  # only needed when a hub model is asked for

    with fetching(key, repo_id, revision):
        return Path(snapshot_download(repo_id=repo_id, revision=revision))


def _record_source(folder: Path, record: dict[str, str | None]) -> None:
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config[MODEL_SOURCE_KEY] = record
    tmp = config_path.with_name(config_path.name + ".tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, config_path)


# A tokenizer is usable from tokenizer.json alone, or from a slow tokenizer's vocabulary files.
_TOKENIZER_FILE_SETS = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",))


def check_model_folder(folder: str | Path, what: str = "--model", tokenizer: bool = True) -> None:
    """Raise ModelFolderError naming the file unless ``folder`` is a loadable Hugging Face model folder:
    it exists (a local path, never looked up on the hub), ``config.json`` is a JSON object, there are
    weight files and each ``*.safetensors`` has a readable header whose tensor shapes are the ones
    ``config.json`` describes (:func:`_shape_mismatch`), and (``tokenizer``) the tokenizer files
    are there with a chat template (every stage renders chats). Cheap: no weight is read.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFolderError(f"{what} {folder} does not exist (a model folder: stages read local folders only)")
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFolderError(f"{what} {folder}: no config.json; is it a Hugging Face model folder?") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFolderError(f"{config_path}: not a readable JSON file ({exc})") from None
    if not isinstance(config, dict):
        raise ModelFolderError(f"{config_path}: expected a JSON object, got {type(config).__name__}")
    weights = sorted(p for p in folder.iterdir() if p.name.endswith(WEIGHT_SUFFIXES))
    if not weights:
        raise ModelFolderError(f"{what} {folder}: no weight files ({', '.join('*' + s for s in WEIGHT_SUFFIXES)})")
    shapes = {}
    for path in weights:
        if path.name.endswith(".safetensors"):
            shapes.update({name: (path.name, shape) for name, shape in _safetensors_shapes(path).items()})
    mismatch = _shape_mismatch(config, shapes)
    if mismatch:
        raise ModelFolderError(
            f"{what} {folder}: config.json does not match the weights: {mismatch}; is config.json from another "
            "model (or were the weights saved after a change to it)?"
        )
    if not tokenizer:
        return
    if not any(all((folder / name).is_file() for name in names) for names in _TOKENIZER_FILE_SETS):
        raise ModelFolderError(
            f"{what} {folder}: no tokenizer (tokenizer.json, or vocab.json + merges.txt, or tokenizer.model)"
        )
    if not _has_chat_template(folder):
        raise ModelFolderError(
            f"{what} {folder}: the tokenizer has no chat template (neither chat_template.jinja nor a chat_template in "
            "tokenizer_config.json), and every stage renders chats with it; use the instruct model's folder or "
            "copy its chat_template.jinja here"
        )


def _has_chat_template(folder: Path) -> bool:
    """Where transformers looks for a tokenizer's chat template: chat_template.jinja, chat_template.json
    or the ``chat_template`` key of tokenizer_config.json."""
    for name in ("chat_template.jinja", "chat_template.json"):
        if (folder / name).is_file() and (folder / name).stat().st_size > 0:
            return True
    try:
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFolderError(f"{folder / 'tokenizer_config.json'}: not a readable JSON file ({exc})") from None
    return isinstance(tokenizer_config, dict) and bool(tokenizer_config.get("chat_template"))


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Each tensor's shape in a safetensors file, from its header: an 8-byte header length, a JSON
    header, then the tensors' bytes. A truncated or damaged file raises ModelFolderError."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            prefix = fh.read(8)
            header_size = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None
            if header_size is None or header_size > size - 8:
                raise ModelFolderError(f"{path}: not a safetensors file (truncated or damaged header)")
            header = json.loads(fh.read(header_size))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFolderError(f"{path}: not a readable safetensors file ({exc})") from None
    try:
        tensors = {key: entry for key, entry in header.items() if key != "__metadata__"}
        ends = [int(entry["data_offsets"][1]) for entry in tensors.values()]
        shapes = {key: [int(n) for n in entry["shape"]] for key, entry in tensors.items()}
    except (AttributeError, KeyError, TypeError, IndexError, ValueError):
        raise ModelFolderError(f"{path}: not a safetensors file (its header lists no tensor offsets)") from None
    if ends and max(ends) > size - 8 - header_size:
        raise ModelFolderError(f"{path}: truncated safetensors file ({size} bytes, the header needs more)")
    return shapes


# The decoder-layer tensors of the Llama family (Llama, Qwen2/2.5/3, Mistral, ...) as transformers
# names them; their shapes follow from config.json alone.
_LAYER_TENSOR = re.compile(r"(?:^|\.)layers\.(\d+)\.(self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\.weight$")


def _shape_mismatch(config: dict[str, Any], shapes: dict[str, tuple[str, list[int]]]) -> str | None:
    """The first tensor whose shape is not what ``config`` says (or a layer count the weights do not
    have), as a sentence naming the tensor, its file and the config keys; None when all agree or
    ``config`` is not a plain decoder the shapes follow from (quantized, multimodal, keys missing).

    transformers refuses a mismatched shape only after it started loading (``ignore_mismatched_sizes``)
    and fills missing layers with random weights, so both are checked here from the headers alone.
    """
    names = ("hidden_size", "vocab_size", "num_attention_heads", "intermediate_size", "num_hidden_layers")
    if (
        "quantization_config" in config
        or "text_config" in config
        or not all(isinstance(config.get(k), int) for k in names)
    ):
        return None
    hidden, vocab, heads, inner = (config[k] for k in names[:4])
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    expected = {
        "q": ([heads * head_dim, hidden], "num_attention_heads x head_dim, hidden_size"),
        "k": ([kv_heads * head_dim, hidden], "num_key_value_heads x head_dim, hidden_size"),
        "v": ([kv_heads * head_dim, hidden], "num_key_value_heads x head_dim, hidden_size"),
        "o": ([hidden, heads * head_dim], "hidden_size, num_attention_heads x head_dim"),
        "gate": ([inner, hidden], "intermediate_size, hidden_size"),
        "up": ([inner, hidden], "intermediate_size, hidden_size"),
        "down": ([hidden, inner], "hidden_size, intermediate_size"),
    }
    layers = set()
    for name, (file, shape) in sorted(shapes.items()):
        want, keys = None, ""
        if name.endswith(("embed_tokens.weight", "lm_head.weight")):
            want, keys = [vocab, hidden], "vocab_size, hidden_size"
        elif (match := _LAYER_TENSOR.search(name)) is not None:
            layers.add(int(match.group(1)))
            want, keys = expected[match.group(3)]
        if want is not None and shape != want:
            return f"{name} in {file} is {shape}, config.json ({keys}) makes it {want}"
    # Multi-token-prediction layers (num_nextn_predict_layers) follow the decoder's in the weights.
    count, extra = config["num_hidden_layers"], config.get("num_nextn_predict_layers") or 0
    if layers and not set(range(count)) <= layers <= set(range(count + extra)):
        return f"config.json has num_hidden_layers {count}, the weights hold layers {min(layers)}..{max(layers)} ({len(layers)})"
    return None
