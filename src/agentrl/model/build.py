"""The base model: a tiny Qwen3 and its tokenizer for the embedded default, or a hub id / path.

Embedded default: a byte-level BPE tokenizer trained on the embedded corpus (rendered SFT
conversations and RL prompts, never the eval sets), numbers cut left to right into chunks of
at most two digits, one token each (``2442`` -> ``24 42``), the special tokens and chat template of
Qwen3 (``<|im_start|>``, ``<|im_end|>``, ``<tool_call>``, ``<tool_response>``, ...), and a
randomly initialised ``Qwen3ForCausalLM`` of ~1.5 M parameters, saved as a normal Hugging Face
folder (safetensors). Everything downstream loads it with ``from_pretrained`` like a hub model.

Why two-digit chunks (a deliberate departure from Qwen, which reads digits one by one): the agent
must copy numbers exactly, from the problem into its code and from the tool output into its
answer. Over a 10-token alphabet every digit recurs in the context, so the induction-style lookup
a transformer copies with ("find where this token was, emit what followed") is ambiguous, and a
1.5 M-parameter model trained on a few hundred trajectories stays at chance on held-out numbers.
Over a 100-token alphabet the lookup is nearly unambiguous and the same model learns to copy.
(Llama 3 and GPT-4 tokenizers chunk digits in threes for related reasons.)

Presets: ``model.base`` (and ``sft.from``, and an ``eval.checkpoints`` entry given as ``{id,
revision}``) is a hub id (downloaded into the Hugging Face cache with
``huggingface_hub.snapshot_download`` when the rule runs, never at DAG-build time) or a local
folder; either way the stage's folder links the model's files and holds a copy of its config.json
stamped with the model's digest (:mod:`agentrl.model.folder`) and its source.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from agentrl.config import EmbeddedModelConfig
from agentrl.model.folder import resolve_pretrained as resolve_pretrained  # re-export: base-model's hub id / folder
from agentrl.model.folder import stamp_model_digest

_TEMPLATES = Path(__file__).parent


def chat_template(tool_header: str) -> str:
    """The embedded tokenizer's chat template: Qwen3's turns after a ``tool_header`` system block.

    ``qwen3``: Qwen3's own tools block (the JSON schema of each tool and the call instructions,
    about 160 tokens here); ``compact``: one line of tool names (``model.embedded.tool_header``).
    """
    header = (_TEMPLATES / f"chat_template_header_{tool_header}.jinja").read_text(encoding="utf-8")
    return header + (_TEMPLATES / "chat_template_turns.jinja").read_text(encoding="utf-8")


PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
# Qwen3 marks <|im_start|>/<|im_end|>/<|endoftext|> special (dropped by skip_special_tokens) and the
# tool markers as plain added tokens (kept in decoded text, so a parser can find them).
SPECIAL_TOKENS = [PAD_TOKEN, "<|im_start|>", EOS_TOKEN]
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


# Every chunk "00".."99" appears this often in the tokenizer's training text, more than any pair of
# bytes in the corpus does by chance, so BPE spends 100 merges on them first.
DIGIT_PAIR_REPEATS = 1000


def train_tokenizer(corpus: Iterable[str], vocab_size: int, tool_header: str) -> PreTrainedTokenizerFast:
    """Byte-level BPE over two-digit number chunks, wrapped as a transformers tokenizer with the
    chat template of :func:`chat_template`."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\d{1,2}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    digit_pairs = " ".join(f"{i:02d}" for i in range(100))
    backend.train_from_iterator(itertools.chain(corpus, [digit_pairs] * DIGIT_PAIR_REPEATS), trainer=trainer)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=1_000_000,
    )
    tokenizer.chat_template = chat_template(tool_header)
    return tokenizer


def build_tiny_qwen3(tokenizer: PreTrainedTokenizerFast, cfg: EmbeddedModelConfig, seed: int) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_embedded_model(corpus: Iterable[str], cfg: EmbeddedModelConfig, seed: int, out_dir: str | Path) -> Path:
    out_dir = Path(out_dir)
    tokenizer = train_tokenizer(corpus, cfg.vocab_size, cfg.tool_header)
    model = build_tiny_qwen3(tokenizer, cfg, seed)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    stamp_model_digest(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
