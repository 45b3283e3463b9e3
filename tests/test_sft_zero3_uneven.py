"""SFT's loss under ZeRO-3 when the ranks hold different numbers of trained tokens.

Each call of a ZeRO-3-partitioned module gathers its parameters, a collective every rank must
issue alike. The vocabulary projection runs once per ``logit_chunk_tokens`` trained targets, so
three torchrun ranks (gloo, real DeepSpeed) with 0, 6 and 30 trained targets and chunks of 8 run
1, 1 and 4 chunks unless the chunk count is agreed across ranks: gloo then aborts with a
collective size mismatch (NCCL would hang). With the count agreed the step's loss and every
parameter's gradient equal those of one process over the same three conversations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

TRAINED = (0, 6, 30)  # trained targets per rank: none, one chunk, several
CHUNK = 8
LENGTH = 40

SHARED = """
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

def tiny_lm():
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=64, tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config).float()

def conversation(rank, trained, length):
    generator = torch.Generator().manual_seed(100 + rank)
    input_ids = torch.randint(0, 64, (1, length), generator=generator)
    loss_mask = torch.zeros(1, length, dtype=torch.long)
    loss_mask[0, length - trained:] = 1  # the last `trained` tokens are assistant tokens
    return input_ids, torch.ones(1, length, dtype=torch.long), loss_mask
"""

WORKER = (
    SHARED
    + """
import json, sys
import deepspeed
from deepspeed.utils import safe_get_full_grad
from agentrl.sft.trainer import AssistantTokenNll
from agentrl.training import deepspeed_engine as dse

trained, chunk, length, out = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ctx = dse.init_distributed(2.0)
config = {
    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": ctx.world_size,
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "steps_per_print": 10**9,
}
optim = dse.OptimizerSettings(lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, schedule="constant",
                              warmup_steps=0, total_steps=1)
engine = dse.build_engine(AssistantTokenNll(tiny_lm(), logit_chunk_tokens=chunk), config, optim)
input_ids, attention_mask, loss_mask = conversation(ctx.rank, trained[ctx.rank], length)
nll_sum, count = engine(input_ids, attention_mask, loss_mask)
assert int(count) == trained[ctx.rank], (int(count), trained[ctx.rank])
engine.backward(nll_sum * ctx.world_size / sum(trained), scale_wrt_gas=False)
grads = {name: safe_get_full_grad(p).tolist() for name, p in engine.module.named_parameters()}
loss = torch.tensor([float(nll_sum.detach())], dtype=torch.float64)
torch.distributed.all_reduce(loss)
engine.step()
if ctx.rank == 0:
    with open(out, "w") as f:
        json.dump({"loss": float(loss[0]) / sum(trained), "grads": grads}, f)
"""
)


def _one_process_reference() -> tuple[float, dict[str, torch.Tensor]]:
    """The token-mean NLL of the three conversations and its gradients, in this process."""
    from agentrl.sft.trainer import AssistantTokenNll

    namespace: dict = {}
    exec(SHARED, namespace)
    model = AssistantTokenNll(namespace["tiny_lm"](), logit_chunk_tokens=CHUNK)
    total = torch.zeros(())
    for rank, trained in enumerate(TRAINED):
        nll_sum, _ = model(*namespace["conversation"](rank, trained, LENGTH))
        total = total + nll_sum
    loss = total / sum(TRAINED)
    loss.backward()
    return float(loss), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.slow
def test_ranks_with_none_one_and_several_logit_chunks_train_as_one_process(tmp_path):
    script, out = tmp_path / "zero3_uneven.py", tmp_path / "out.json"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(len(TRAINED))]
    command += [str(script), json.dumps(TRAINED), str(CHUNK), str(LENGTH), str(out)]
    done = subprocess.run(command, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]

    result = json.loads(out.read_text())
    loss, grads = _one_process_reference()
    assert result["loss"] == pytest.approx(loss, rel=1e-5)
    assert result["grads"].keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(torch.tensor(result["grads"][name]), grad, rtol=1e-4, atol=1e-6, msg=name)
