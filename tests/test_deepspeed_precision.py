"""bf16 training on the paper preset accumulates and reduces gradients in fp32.

DeepSpeed 0.19's ZeRO-2 and ZeRO-3 accumulate micro-batch gradients in the model dtype unless
``data_types.grad_accum_dtype`` says otherwise (``DeepSpeedEngine.get_data_types``), and reduce
them in it unless ``communication_data_type`` does; with 10-16 micro-batches per mini-batch in
bf16 that loses the small ones. configs/deepspeed/zero2.json and zero3.json set both to fp32.
The engine here is built as the stages build it (``build_stage_engine``) from the preset's SFT
(ZeRO-3) and GRPO (ZeRO-2) sections on a tiny bf16 Qwen3, on CPU (DeepSpeed's CPU accelerator
runs bf16), and asked what it uses; two micro-batches then run to show the gradient buffer it
accumulates into is fp32.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml
from helpers.tiny_models import qwen3_bf16

from agentrl.config import load_config
from agentrl.training.deepspeed_engine import (
    build_stage_engine,
    close_distributed,
    find_deepspeed_config,
    init_distributed,
)

ROOT = Path(__file__).resolve().parents[1]
_LAUNCHER_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def process_group():
    """One one-process group for both engines (DeepSpeed keeps its data-parallel group between
    engines, so a second group would not be the one it knows); the launcher keys are restored after."""

    saved = {key: os.environ.pop(key) for key in _LAUNCHER_KEYS if key in os.environ}
    yield init_distributed()
    close_distributed()
    for key in _LAUNCHER_KEYS:
        os.environ.pop(key, None)
    os.environ.update(saved)


def _paper_section(name: str):
    raw = yaml.safe_load((ROOT / "presets" / "paper-qwen3-4b.yaml").read_text(encoding="utf-8"))
    return getattr(load_config(raw), name)


@pytest.mark.parametrize(("section", "stage"), [("sft", 3), ("grpo", 2)])
def test_the_paper_preset_accumulates_and_reduces_bf16_gradients_in_fp32(process_group, section, stage):
    settings = _paper_section(section)
    assert (settings.deepspeed.zero_stage, settings.deepspeed.dtype) == (stage, "bfloat16")
    engine = build_stage_engine(
        qwen3_bf16(),
        settings,
        find_deepspeed_config(stage),
        process_group,
        torch.bfloat16,
        hidden_size=32,
        micro_batch_size=1,
        accumulation=2,
        warmup_steps=0,
        total_steps=4,
    )
    assert engine.zero_optimization_stage() == stage
    assert engine.get_data_types() == (torch.bfloat16, torch.float32), "model dtype, gradient accumulation dtype"
    assert engine.communication_data_type == torch.float32
    assert engine.optimizer.gradient_accumulation_dtype == torch.float32
    assert engine.optimizer.communication_data_type == torch.float32

    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(1))
    for _ in range(2):  # two micro-batches of one optimizer step
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
    assert all(p.dtype == torch.bfloat16 for p in engine.module.parameters()), "the model trains in bf16"
    if stage == 2:  # the reduced gradients are added into an fp32 partition
        buffers = [group.flat_partition for group in engine.optimizer.averaged_gradients.values()]
    else:
        buffers = [engine.optimizer.grad_partitions_flat_buffer]
    assert buffers and all(b.dtype == torch.float32 for b in buffers)
    assert any(bool(b.abs().sum() > 0) for b in buffers), "the gradients went into that buffer"
    engine.step()


def test_a_bf16_load_gives_the_master_weights_of_a_float32_load(process_group, tmp_path):
    """The trainers load the model in the training dtype: DeepSpeed casts the module to bf16 and
    builds its fp32 master weights from that cast, so the float32 load's 2x memory buys nothing."""
    from transformers import Qwen3ForCausalLM

    from agentrl.training.model import load_causal_lm

    torch.manual_seed(0)  # float32 weights that bf16 cannot hold exactly
    Qwen3ForCausalLM(qwen3_bf16().config).float().save_pretrained(tmp_path / "policy")
    settings = _paper_section("grpo")
    masters = []
    for load_dtype in (torch.float32, torch.bfloat16):
        model = load_causal_lm(tmp_path / "policy", dtype=load_dtype)
        assert next(model.parameters()).dtype == load_dtype
        if load_dtype == torch.float32:
            assert any(not torch.equal(p, p.bfloat16().float()) for p in model.parameters())
        engine = build_stage_engine(
            model,
            settings,
            find_deepspeed_config(2),
            process_group,
            torch.bfloat16,
            hidden_size=32,
            micro_batch_size=1,
            accumulation=1,
            warmup_steps=0,
            total_steps=1,
        )
        masters.append([p.clone() for p in engine.optimizer.single_partition_of_fp32_groups])
    assert all(m.dtype == torch.float32 for m in masters[0])
    for from_fp32, from_bf16 in zip(*masters, strict=True):
        assert torch.equal(from_fp32, from_bf16)
