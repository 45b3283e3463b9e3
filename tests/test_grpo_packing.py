"""grpo.packing: padding-free micro-batches, the samples end to end in one row.

A packed forward must be the padded forward's function of the weights: the same log-probs,
entropies and gradients to float round-off on samples of very different lengths (with and
without gradient checkpointing, whose backward recomputes the layers), no attention across a
sample boundary, and the same DeepSpeed update, in one process and over two torchrun ranks whose
token loads differ, where every rank runs the same number of micro-batches and optimizer steps.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.grpo_updates import deepspeed_update, uneven_samples
from helpers.tiny_models import qwen3_for_updates

from agentrl.grpo import algorithm as alg
from agentrl.grpo.batching import collate, pack_token_budget
from agentrl.grpo.policy import ResponseLogProbs
from agentrl.training.packing import pack_sequences

# lengths from 3 to 206 tokens in one micro-batch: the padded batch is ~3x the packed row
SHAPES = ((6, (200, 3, 41)), (2, (1, 120)), (9, (17, 60)))


def test_pack_token_budget_fills_first_fit_and_covers_every_index_once():
    lengths = [90, 10, 50, 45, 200, 5, 60]
    groups = pack_token_budget(lengths, 100)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        assert len(group) == 1 or sum(lengths[i] for i in group) <= 100, group
    # longest first, each into the first row with room: 200 alone (over the budget), 90 + 10, 60 + 5, 50 + 45
    assert groups == [[4], [0, 1], [6, 5], [2, 3]]


def test_a_packed_row_restarts_positions_at_each_sequence():
    row = pack_sequences([[7, 8, 9], [4], [5, 6]])
    assert row.input_ids.tolist() == [[7, 8, 9, 4, 5, 6]]
    assert row.position_ids.tolist() == [[0, 1, 2, 0, 0, 1]]
    assert row.cu_seqlens.tolist() == [0, 3, 4, 6] and row.max_length == 3
    assert row.starts.tolist() == [0, 3, 4] and row.lengths.tolist() == [3, 1, 2]


def _logps_and_grads(samples, packed: bool, temperature: float, checkpointing: bool = False):
    model = qwen3_for_updates()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    batch = collate(samples, pad_token_id=0, packed=packed)
    logp, entropy = ResponseLogProbs(model, logit_chunk_tokens=7, temperature=temperature)(
        batch, with_entropy=True, entropy_grad=True
    )
    loss = -alg.masked_sum(logp * batch.advantages, batch.loss_mask) - 0.1 * alg.masked_sum(entropy, batch.loss_mask)
    loss.backward()
    mask = batch.loss_mask.bool()
    return batch, logp[mask], entropy[mask], {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize(("temperature", "checkpointing"), [(1.0, False), (0.7, False), (1.0, True)])
def test_packed_logprobs_entropies_and_gradients_equal_the_padded_forward(temperature, checkpointing):
    samples = uneven_samples(50, SHAPES)
    padded, logp, entropy, grads = _logps_and_grads(samples, False, temperature, checkpointing)
    packed, packed_logp, packed_entropy, packed_grads = _logps_and_grads(samples, True, temperature, checkpointing)
    # each group's prompt once: its other samples hold only the prompt's last token
    shared = sum((len(responses) - 1) * (prompt - 1) for prompt, responses in SHAPES)
    assert packed.packed is not None and packed.input_ids.shape == (1, sum(len(s.input_ids) for s in samples) - shared)
    assert packed.num_tokens * 2.5 < padded.num_tokens, "the batch should be mostly padding when padded"
    torch.testing.assert_close(packed_logp, logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed_entropy, entropy, atol=1e-5, rtol=1e-5)
    for name, grad in grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(packed_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_changing_one_sample_changes_no_other_samples_logprobs():
    """No attention across a boundary: sample 1's new tokens leave the others' log-probs as they
    were, and its own change (the test can fail)."""
    samples = uneven_samples(50, SHAPES)
    changed = copy.deepcopy(samples)
    changed[1].input_ids = [(t + 7) % 45 + 5 for t in changed[1].input_ids]  # same length, other tokens
    model = qwen3_for_updates().eval()
    actor = ResponseLogProbs(model, logit_chunk_tokens=64, temperature=1.0)
    with torch.no_grad():
        before, _ = actor(collate(samples, 0, packed=True))
        after, _ = actor(collate(changed, 0, packed=True))
    others = [i for i in range(len(samples)) if i != 1]
    torch.testing.assert_close(after[others], before[others], atol=1e-6, rtol=0)
    assert (after[1] - before[1]).abs().max() > 1e-3


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_a_deepspeed_update_packed_equals_the_padded_one(zero_stage, monkeypatch):
    """The trainer's own plan, micro-batches and DeepSpeed steps, with a budget that cuts the
    samples into several packed rows: the first step's gradients, the norms, the loss and the
    weights after one update."""
    from helpers.rollout import random_policy

    model_dir = random_policy()
    samples = uneven_samples(300, ((6, (90, 3)), (4, (14, 1))))
    overrides = {"deepspeed": {"zero_stage": zero_stage}, "share_prompts": False}
    plain = deepspeed_update(model_dir, copy.deepcopy(samples), 10_000, {**overrides, "packing": False}, monkeypatch)
    monkeypatch.undo()
    plan, stats, norms, params, cfg, grads = deepspeed_update(
        model_dir, copy.deepcopy(samples), 20, {**overrides, "packing": True}, monkeypatch
    )
    assert len(plan[0].micro_batches) == 3, "the 20-token budget should cut the samples into three rows"
    for name, grad in plain[5].items():
        torch.testing.assert_close(grads[name], grad, atol=1e-7, rtol=1e-4, msg=name)
    assert norms == pytest.approx(plain[2], rel=1e-5)
    assert stats["actor/pg_loss"] == pytest.approx(plain[1]["actor/pg_loss"], abs=1e-6)
    for name, value in plain[3].items():
        torch.testing.assert_close(params[name], value, atol=0.05 * cfg.grpo.lr, rtol=0, msg=name)


# Rank 0 holds the long samples, rank 1 short ones: with a 64-token budget rank 0 needs several
# micro-batches per mini-batch and rank 1 one, which it pads with empty micro-batches.
RANK_SHAPES = (((6, (50, 30)), (3, (40, 2))), ((2, (4, 3)), (1, (2, 5))))
WORKER = """
import json, sys
import pytest
from helpers.grpo_updates import deepspeed_update, uneven_samples
from agentrl.training import deepspeed_engine as dse

model_dir, out, shapes, overrides = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
ctx = dse.init_distributed(2.0)
samples = uneven_samples(300, shapes[ctx.rank])
overrides = {"share_prompts": False, "batch_prompts": 4, "mini_batch_prompts": 4, "deepspeed": {"zero_stage": 2}, **overrides}
plan, stats, norms, params, cfg, grads = deepspeed_update(model_dir, samples, 64, overrides, pytest.MonkeyPatch())
with open(f"{out}.{ctx.rank}", "w") as f:
    json.dump({"micro_batches": [len(m.micro_batches) for m in plan],
               "own": [sum(1 for mb in m.micro_batches if mb) for m in plan],
               "tokens": stats["rank/input_tokens"],
               "optimizer_steps": len(norms), "norms": norms, "pg_loss": stats["actor/pg_loss"],
               "grads": {k: v.tolist() for k, v in grads.items()}}, f)
"""


def _two_ranks(tmp_path: Path, model_dir: Path, mode: str, overrides: dict) -> list[dict]:
    script, out = tmp_path / "worker.py", tmp_path / f"{mode}.json"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    tests = str(Path(__file__).parent)
    env["PYTHONPATH"] = os.pathsep.join([tests, env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    command += [str(model_dir), str(out), json.dumps(RANK_SHAPES), json.dumps(overrides)]
    done = subprocess.run(command, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]


@pytest.mark.slow
def test_two_ranks_of_uneven_loads_run_alike_packed_padded_or_balanced(tmp_path):
    """torchrun, gloo, real DeepSpeed (ZeRO-2): packed and padded give the same gradients and
    loss over two ranks whose token loads differ, and each rank runs as many micro-batches and
    optimizer steps as the other, the short rank padding with empty micro-batches. Balanced
    (grpo.balance_ranks), the samples move to equal token loads, and the gradients stay the same."""
    from helpers.rollout import random_policy

    model_dir = random_policy()
    padded = _two_ranks(tmp_path, model_dir, "padded", {"packing": False, "balance_ranks": False})
    packed = _two_ranks(tmp_path, model_dir, "packed", {"packing": True, "balance_ranks": False})
    balanced = _two_ranks(tmp_path, model_dir, "balanced", {"packing": True, "balance_ranks": True})
    for ranks in (padded, packed, balanced):
        assert ranks[0]["micro_batches"] == ranks[1]["micro_batches"]
        assert ranks[0]["optimizer_steps"] == ranks[1]["optimizer_steps"] == 1
        assert ranks[0]["norms"] == ranks[1]["norms"]
    assert packed[0]["own"][0] > 1 and packed[1]["own"][0] == 1, "rank 0 should need several packed rows"
    assert packed[1]["micro_batches"][0] > packed[1]["own"][0], "rank 1 should pad with empty micro-batches"
    assert packed[0]["tokens"] > 4 * packed[1]["tokens"]
    total = packed[0]["tokens"] + packed[1]["tokens"]
    assert balanced[0]["tokens"] + balanced[1]["tokens"] == total
    assert abs(balanced[0]["tokens"] - balanced[1]["tokens"]) < 0.2 * total, balanced
    for other in (packed, balanced):
        assert other[0]["norms"] == pytest.approx(padded[0]["norms"], rel=1e-5)
        # each rank's part of the loss moves with its samples; the step logs their mean
        mean_loss = (other[0]["pg_loss"] + other[1]["pg_loss"]) / 2
        assert mean_loss == pytest.approx((padded[0]["pg_loss"] + padded[1]["pg_loss"]) / 2, abs=1e-6)
        for name, grad in padded[0]["grads"].items():
            torch.testing.assert_close(
                torch.tensor(other[0]["grads"][name]), torch.tensor(grad), atol=1e-7, rtol=1e-4, msg=name
            )


def test_the_packed_attention_keeps_the_models_own_attention_for_unpacked_calls():
    """The hf engine shares the actor's module and decodes with its own CPU attention: enabling
    the packed attention must leave every unpacked call to it."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    calls = []

    def own_attention(*args, **kwargs):
        calls.append(kwargs.get("cu_seq_lens_q") is not None)
        return sdpa_attention_forward(*args, **kwargs)

    AttentionInterface.register("test_own_attention", own_attention)
    AttentionMaskInterface.register("test_own_attention", sdpa_mask)
    model = qwen3_for_updates().eval()
    model.set_attn_implementation("test_own_attention")
    samples = uneven_samples(50, SHAPES)
    actor = ResponseLogProbs(model, logit_chunk_tokens=64, temperature=1.0)
    with torch.no_grad():
        padded, _ = actor(collate(samples, 0))
        packed, _ = actor(collate(samples, 0, packed=True))
        assert model.config._attn_implementation == "agentrl_packed_test_own_attention"
        calls.clear()
        again, _ = actor(collate(samples, 0))
    assert calls == [False, False], "unpacked calls go to the model's own attention, one per layer"
    torch.testing.assert_close(again, padded, atol=0, rtol=0)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "packing",
    [True, pytest.param(False, marks=pytest.mark.long)],  # CI: packed (the default), same chunk loop
)
def test_zero3_ranks_with_different_logit_chunk_counts_train_as_zero2(tmp_path, packing):
    """ZeRO-3 (placement separate, its only layout): every call of the output projection gathers its
    partitioned weight, a collective. Rank 0's micro-batches hold many chunks of 7 loss tokens,
    rank 1's one each (and its padding micro-batches one position): in the recomputation pass and
    in the update both ranks must still issue the same calls, and train as ZeRO-2 does."""
    from helpers.rollout import random_policy

    model_dir = random_policy()
    common = {"packing": packing, "balance_ranks": False, "old_logprobs": "recompute", "placement": "separate"}
    zero2 = _two_ranks(tmp_path, model_dir, "zero2", {**common, "deepspeed": {"zero_stage": 2}})
    zero3 = _two_ranks(tmp_path, model_dir, "zero3", {**common, "deepspeed": {"zero_stage": 3}})
    assert zero3[0]["micro_batches"] == zero3[1]["micro_batches"]
    assert zero3[0]["tokens"] > 4 * zero3[1]["tokens"], "rank 0 should hold many more logit chunks"
    assert zero3[0]["norms"] == zero3[1]["norms"] == pytest.approx(zero2[0]["norms"], rel=1e-5)
    for rank in range(2):
        assert zero3[rank]["pg_loss"] == pytest.approx(zero2[rank]["pg_loss"], abs=1e-6)
    for name, grad in zero2[0]["grads"].items():
        torch.testing.assert_close(
            torch.tensor(zero3[0]["grads"][name]), torch.tensor(grad), atol=1e-7, rtol=1e-4, msg=name
        )
