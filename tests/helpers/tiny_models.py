"""The tiny Qwen3 shapes the tests build, in one place.

They differ on purpose: the tests' expected numbers (losses, learning thresholds, run lengths)
were measured on each shape, so a test keeps its own. A new test picks one that fits before
adding another.
"""

from __future__ import annotations

import dataclasses

import torch

from agentrl.config import EmbeddedModelConfig, load_config


def tiny_shape(**sizes) -> EmbeddedModelConfig:
    """The embedded model's config with these sizes, Qwen3's tools block (what the tests' figures
    were measured with) and the schema's other values."""
    return dataclasses.replace(load_config({}).model.embedded, tool_header="qwen3", **sizes)


# helpers.rollout's random and trained policies: faster than the embedded default, the same
# architecture, context for multi-turn rollouts.
ROLLOUT_POLICY = tiny_shape(
    vocab_size=1024,
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    intermediate_size=128,
    max_position_embeddings=2048,
)
# helpers.released's stand-ins for hub models, loaded by transformers and vLLM in workflow runs.
RELEASED_STAND_IN = tiny_shape(
    vocab_size=400,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    intermediate_size=64,
    max_position_embeddings=4096,
)
# helpers.sft_runs: the SFT stage's subprocess runs (1 vs 2 processes, ZeRO-2/3, resume), whose
# loss must fall by a fifth in 12 steps.
SFT_RUN = tiny_shape(
    vocab_size=480,
    hidden_size=48,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=24,
    intermediate_size=96,
    max_position_embeddings=512,
)
# test_tracking_progress's SFT runs: one layer, only the tracked metrics matter.
SFT_TRACKING = tiny_shape(
    vocab_size=480,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    intermediate_size=64,
    max_position_embeddings=512,
)
# test_sft_batching's in-process gradients of packed and unpacked micro-batches.
SFT_PACKING = tiny_shape(
    vocab_size=300,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    intermediate_size=64,
    max_position_embeddings=256,
)


def qwen3_for_updates(seed: int = 0) -> torch.nn.Module:
    """A randomly initialised 2-layer Qwen3 of 50 tokens in float32, seeded: the GRPO update tests
    compare its log-probabilities and gradients with hand-computed ones."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config).float()


def qwen3_bf16() -> torch.nn.Module:
    """A 2-layer Qwen3 of 128 tokens in bfloat16, seed 0: DeepSpeed's bf16 gradient reduction tests."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
    )
    return Qwen3ForCausalLM(config).to(torch.bfloat16)
