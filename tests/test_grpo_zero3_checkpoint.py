"""A GRPO checkpoint under ZeRO-3 holds the model, not its partitions.

Under ZeRO-3 each rank keeps a partition of every parameter and the module's own tensors are
empty until gathered. The checkpoint's Hugging Face folder (evaluated as it is through
``eval.checkpoints``) must hold the same tensors as the final export, which gathers them. One
CPU rank with real DeepSpeed ZeRO-3, through ``grpo.checkpoint.save_checkpoint`` as the trainer
calls it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from agentrl.config import load_config
from agentrl.grpo.checkpoint import save_checkpoint
from agentrl.grpo.policy import ResponseLogProbs
from agentrl.grpo.trainer import GrpoPaths, build_engine
from agentrl.model.tokenizer import load_chat_tokenizer
from agentrl.training import deepspeed_engine as dse
from agentrl.training.hf_export import WEIGHTS_NAME
from agentrl.training.model import load_causal_lm


def test_a_zero3_checkpoints_model_folder_equals_the_final_export(tmp_path):
    from helpers.rollout import random_policy

    model_dir = random_policy()
    cfg = load_config({"grpo": {"placement": "separate", "deepspeed": {"zero_stage": 3}}})
    ctx = dse.init_distributed()
    deepspeed_config = dse.find_deepspeed_config(3)
    paths = GrpoPaths(model_dir, Path("-"), (), Path("-"), Path("-"), Path("-"), deepspeed_config)
    policy = load_causal_lm(model_dir, device=ctx.device)
    engine = build_engine(
        ResponseLogProbs(policy, logit_chunk_tokens=8, temperature=1.0), cfg, paths, ctx, torch.float32, 1
    )
    assert engine.zero_optimization_stage() == 3
    assert any(p.numel() == 0 for p in policy.parameters()), "ZeRO-3 should leave the module's tensors partitioned"
    tokenizer = load_chat_tokenizer(model_dir)

    folder = save_checkpoint(
        engine,
        tmp_path / "checkpoints",
        1,
        trainer_state={"sampler": {}},
        fingerprint={"run": 1},
        metrics=[],
        policy=policy,
        tokenizer=tokenizer,
        ctx=ctx,
        keep=None,
    )
    dse.save_hf_model(engine, policy, tokenizer, tmp_path / "final", ctx)

    saved, final = load_file(folder / WEIGHTS_NAME), load_file(tmp_path / "final" / WEIGHTS_NAME)
    original = load_file(model_dir / WEIGHTS_NAME)
    assert saved.keys() == final.keys() == original.keys()
    for name, tensor in original.items():
        assert saved[name].shape == tensor.shape, f"{name}: the checkpoint holds shape {tuple(saved[name].shape)}"
        torch.testing.assert_close(saved[name], final[name], rtol=0, atol=0, msg=name)
        torch.testing.assert_close(saved[name], tensor, rtol=0, atol=0, msg=name)
