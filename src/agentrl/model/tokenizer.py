"""The tokenizer of a policy folder, as every stage that renders chats needs it: with a chat
template (the agent loop and SFT render conversations with it), and the id batches are padded with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.errors import ModelFolderError


def load_chat_tokenizer(model_dir: str | Path) -> Any:
    """``AutoTokenizer`` of ``model_dir``; a folder whose tokenizer has no chat template is refused."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if not tokenizer.chat_template:
        raise ModelFolderError(f"{model_dir}: the tokenizer has no chat template; the agent loop needs one")
    return tokenizer


def pad_token_id(tokenizer: Any) -> int:
    """The pad token, or end of sequence where the tokenizer has none (Qwen's base tokenizers)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ModelFolderError(f"{tokenizer.name_or_path}: the tokenizer has neither a pad nor an eos token")
    return int(pad)


def end_of_sequence_ids(model: Any, tokenizer: Any = None) -> tuple[int, ...]:
    """The ids that end a generation whatever the caller's stop tokens, as vLLM stops with
    ``ignore_eos`` off (``SamplingParams.update_from_generation_config``): the tokenizer's end of
    sequence (vLLM's primary EOS; the model config's where no tokenizer is given) and every
    ``eos_token_id`` of the model's generation config (an int or a list; Qwen3's instruct models
    list ``<|im_end|>`` and ``<|endoftext|>``)."""
    ids: set[int] = set()
    source = tokenizer if tokenizer is not None else getattr(model, "config", None)
    primary = getattr(source, "eos_token_id", None)
    for value in (primary, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if value is not None:
            ids.update([value] if isinstance(value, int) else value)
    return tuple(sorted(ids))
