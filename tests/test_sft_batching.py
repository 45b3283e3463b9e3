"""SFT data order, token-budget micro-batches and the loss normalisation (fast, no DeepSpeed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.tiny_models import SFT_PACKING

from agentrl.config import ConfigError, load_config, load_config_file
from agentrl.data.records import SftExample
from agentrl.model.build import build_tiny_qwen3, train_tokenizer
from agentrl.sft.batching import (
    TokenizedExample,
    collate,
    pack_micro_batches,
    step_indices,
    steps_per_epoch,
    tokenize_examples,
)
from agentrl.sft.trainer import AssistantTokenNll, plan_steps
from agentrl.training.deepspeed_engine import fill_deepspeed_config, find_deepspeed_config, load_deepspeed_config

LENGTHS = [50, 400, 120, 30, 390, 200, 60, 45]


def _positions(per_rank):
    return sorted(p for rank in per_rank for micro in rank for p in micro)


@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize(("micro", "budget"), [(4, None), (2, None), (8, 800), (3, 450)])
def test_packing_covers_every_sequence_once_with_equal_counts_per_rank(ranks, micro, budget):
    per_rank = pack_micro_batches(LENGTHS, micro, budget, ranks)
    assert len(per_rank) == ranks
    assert _positions(per_rank) == list(range(len(LENGTHS)))
    assert len({len(r) for r in per_rank}) == 1, "every rank must run the same number of backward passes"
    for rank in per_rank:
        for batch in rank:
            assert len(batch) <= micro
            if budget is not None and len(batch) > 1:
                assert len(batch) * max(LENGTHS[i] for i in batch) <= budget


def test_packing_groups_similar_lengths_and_runs_an_oversized_sequence_alone():
    (batches,) = pack_micro_batches(LENGTHS, 8, 500, 1)
    assert sorted(sorted(LENGTHS[i] for i in b) for b in batches) == [[30, 45, 50, 60], [120, 200], [390], [400]]
    (fixed,) = pack_micro_batches(LENGTHS, 4, None, 1)
    assert sorted(sorted(LENGTHS[i] for i in b) for b in fixed) == [[30, 45, 50, 60], [120, 200, 390, 400]]


def test_packing_refuses_a_batch_that_does_not_split_over_the_ranks():
    with pytest.raises(ValueError, match="multiple of the process count"):
        pack_micro_batches([10, 20, 30], 2, None, 2)


def test_data_order_is_a_pure_function_of_seed_epoch_and_step():
    n, batch = 10, 3
    assert steps_per_epoch(n, batch) == 3
    epoch0 = [step_indices(s, n, batch, seed=1) for s in range(3)]
    flat = [i for b in epoch0 for i in b]
    assert len(set(flat)) == 9, "an epoch never repeats a conversation"
    assert step_indices(1, n, batch, seed=1) == epoch0[1]
    assert step_indices(3, n, batch, seed=1) != epoch0[0], "each epoch is reshuffled"
    assert step_indices(0, n, batch, seed=2) != epoch0[0]
    with pytest.raises(ValueError, match="larger than the data set"):
        steps_per_epoch(3, 4)


def _tiny_lm_and_examples():
    conversations = []
    for a in range(6):
        conversations.append(
            SftExample(
                id=f"ex{a}",
                tools=[],
                messages=[
                    {"role": "user", "content": f"Add {a} and {a * 7 + 3}." + " Please." * a},
                    {"role": "assistant", "content": f"It is {a + a * 7 + 3}." + " Done." * (5 - a)},
                ],
            )
        )
    tokenizer = train_tokenizer(["Add and It is Please Done"] * 5, 300, "qwen3")
    lm = build_tiny_qwen3(tokenizer, SFT_PACKING, seed=0)
    examples = tokenize_examples(conversations, tokenizer, max_length=256, truncation="right")
    return lm, tokenizer, examples


def _step_gradient(lm, tokenizer, examples, packing):
    """Gradient of (sum of trained-token NLL) / (trained tokens of the step), micro-batch by micro-batch."""
    model = AssistantTokenNll(lm, logit_chunk_tokens=7)  # small chunks: exercises the recomputed path
    model.zero_grad()
    total = sum(e.trained_targets for e in examples)
    for micro in packing:
        batch = collate([examples[i] for i in micro], tokenizer.pad_token_id)
        nll, count = model(batch["input_ids"], batch["attention_mask"], batch["loss_mask"])
        assert int(count) == sum(examples[i].trained_targets for i in micro)
        (nll / total).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_the_step_gradient_does_not_depend_on_how_the_step_is_packed():
    lm, tokenizer, examples = _tiny_lm_and_examples()
    lengths = [len(e.input_ids) for e in examples]
    assert len(set(lengths)) > 1, "the check needs padding"
    one_batch = _step_gradient(lm, tokenizer, examples, [list(range(6))])
    for micro, budget, ranks in [(1, None, 1), (2, None, 2), (6, 3 * max(lengths), 1)]:
        packing = [m for rank in pack_micro_batches(lengths, micro, budget, ranks) for m in rank]
        torch.testing.assert_close(_step_gradient(lm, tokenizer, examples, packing), one_batch, rtol=1e-5, atol=1e-7)


def test_padding_and_untrained_positions_add_no_loss():
    lm, tokenizer, examples = _tiny_lm_and_examples()
    model = AssistantTokenNll(lm)
    alone = model(**collate([examples[0]], tokenizer.pad_token_id))[0]
    padded = collate([examples[0], examples[5]], tokenizer.pad_token_id)
    both = model(**padded)[0]
    other = model(**collate([examples[5]], tokenizer.pad_token_id))[0]
    torch.testing.assert_close(both, alone + other, rtol=1e-5, atol=1e-5)
    nothing = TokenizedExample("empty", examples[0].input_ids, [0] * len(examples[0].input_ids))
    nll, count = model(**collate([nothing], tokenizer.pad_token_id))
    assert float(nll.detach()) == 0.0 and int(count) == 0 and nll.requires_grad


def test_truncation_right_or_error():
    lm, tokenizer, _ = _tiny_lm_and_examples()
    long = SftExample(
        id="long", tools=[], messages=[{"role": "user", "content": "x " * 50}, {"role": "assistant", "content": "y"}]
    )
    (cut,) = tokenize_examples([long], tokenizer, max_length=20, truncation="right")
    assert len(cut.input_ids) == 20 and cut.trained_targets == 0
    with pytest.raises(ValueError, match="row 0 \\(id 'long'\\) has .* tokens, more than sft.max_length=20"):
        tokenize_examples([long], tokenizer, max_length=20, truncation="error", source="sft.parquet")


def test_plan_matches_the_deepspeed_batch_identity():
    cfg = load_config({"sft": {"global_batch_size": 32, "micro_batch_size": 4, "epochs": 5, "warmup_ratio": 0.1}}).sft
    plan = plan_steps(cfg, num_examples=3000, world_size=8)
    assert (plan.steps_per_epoch, plan.total_steps, plan.warmup_steps) == (93, 465, 46)
    assert plan.micro_batch_size * plan.accumulation * 8 == 32 and plan.micro_batch_size == 4
    odd = load_config({"sft": {"global_batch_size": 6, "micro_batch_size": 4}}).sft
    plan = plan_steps(odd, num_examples=12, world_size=1)
    assert plan.micro_batch_size * plan.accumulation == 6
    with pytest.raises(ConfigError, match="multiple of the process count"):
        plan_steps(odd, num_examples=12, world_size=4)


def test_deepspeed_configs_fill_every_auto():
    for stage in (0, 2, 3):
        template = load_deepspeed_config(find_deepspeed_config(stage), stage)
        filled = fill_deepspeed_config(
            template,
            micro_batch_size=4,
            gradient_accumulation_steps=1,
            world_size=8,
            grad_clip=1.0,
            dtype=torch.bfloat16,
            hidden_size=2560,
        )
        assert "auto" not in json.dumps(filled)
        assert filled["train_batch_size"] == 32 and filled["bf16"]["enabled"] is True
        assert filled["zero_optimization"]["stage"] == stage
    with pytest.raises(ValueError, match="zero_optimization.stage=2 but the config asks for zero_stage=3"):
        load_deepspeed_config(find_deepspeed_config(2), 3)
    with pytest.raises(ValueError, match="'optimizer.params.lr' is \"auto\" but nothing fills it"):
        fill_deepspeed_config(
            {"optimizer": {"params": {"lr": "auto"}}},
            micro_batch_size=1,
            gradient_accumulation_steps=1,
            world_size=1,
            grad_clip=1.0,
            dtype=torch.float32,
            hidden_size=8,
        )


def test_sft_config_section_and_paper_preset():
    cfg = load_config({}).sft
    assert cfg.lr_schedule == "cosine" and cfg.truncation == "right"
    with pytest.raises(ConfigError, match="unknown key"):
        load_config({"sft": {"learning_rate": 1e-5}})
    with pytest.raises(ConfigError, match="sft.deepspeed.zero_stage"):
        load_config({"sft": {"deepspeed": {"zero_stage": 1}}})
    paper = load_config_file(Path(__file__).resolve().parents[1] / "presets" / "paper-qwen3-4b.yaml")
    assert paper.model.base == "Qwen/Qwen3-4B-Instruct-2507" and paper.data.source == "upstream"
    sft = paper.sft
    assert (sft.lr, sft.lr_schedule, sft.warmup_ratio, sft.betas, sft.weight_decay, sft.grad_clip) == (
        1e-5,
        "cosine",
        0.1,
        (0.9, 0.95),
        0.01,
        1.0,
    )
    assert (sft.global_batch_size, sft.micro_batch_size, sft.epochs, sft.max_length, sft.truncation) == (
        32,
        4,
        5,
        32768,
        "right",
    )


# --------------------------------------------------------------------------- length grouping
def _cost(batches, lengths, overhead):
    return sum(len(b) * max(lengths[i] for i in b) + overhead for b in batches)


def _all_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in _all_partitions(rest):
        yield [[first], *partition]
        for k in range(len(partition)):
            yield [*partition[:k], [first, *partition[k]], *partition[k + 1 :]]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("micro", "budget", "overhead"), [(8, None, 64), (3, None, 0), (8, 900, 128), (2, 500, 10)])
def test_length_grouping_finds_the_cheapest_split_of_all(seed, micro, budget, overhead):
    """The cut of the sorted order is the least padded + overhead x count over *every* set partition."""
    import random

    from agentrl.sft.batching import group_by_length

    rng = random.Random(seed)
    lengths = [rng.randint(20, 400) for _ in range(7)]
    batches = group_by_length(lengths, micro, budget, overhead)
    assert sorted(i for b in batches for i in b) == list(range(7))

    def allowed(b):
        return len(b) == 1 or (len(b) <= micro and (budget is None or len(b) * max(lengths[i] for i in b) <= budget))

    best = min(_cost(p, lengths, overhead) for p in _all_partitions(list(range(7))) if all(map(allowed, p)))
    assert all(map(allowed, batches)) and _cost(batches, lengths, overhead) == best


@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("overhead", [0, 128, 10_000])
def test_length_grouping_keeps_every_sequence_of_the_step_with_equal_counts_per_rank(ranks, overhead):
    per_rank = pack_micro_batches(LENGTHS, 8, None, ranks, overhead)
    assert _positions(per_rank) == list(range(len(LENGTHS)))
    assert len({len(r) for r in per_rank}) == 1
    (huge,) = pack_micro_batches(LENGTHS, 8, None, 1, 10_000)
    assert len(huge) == 1, "a forward dearer than any padding: one micro-batch, as the greedy fill"


def _varied_conversations(count: int) -> list[SftExample]:
    """Real tool-use conversations of the embedded arithmetic format, 1 to 3 tool calls each."""
    from helpers.rollout import sft_conversations

    from agentrl.data.prompts import CODE_INTERPRETER_TOOL

    out = []
    for index, messages in enumerate(sft_conversations(count)):
        call, tool = messages[1], messages[2]
        retries = [call, {"role": "tool", "content": "NameError: name 'x' is not defined\n"}] * (index % 3)
        out.append(SftExample(f"c{index}", [messages[0], *retries, call, tool, messages[3]], [CODE_INTERPRETER_TOOL]))
    return out


def test_length_grouping_cuts_the_padding_of_a_real_step():
    from helpers.rollout import random_policy
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_policy())
    examples = tokenize_examples(_varied_conversations(8), tokenizer, max_length=1024, truncation="right")
    lengths = [len(e.input_ids) for e in examples]

    def padding(overhead):
        (batches,) = pack_micro_batches(lengths, 8, None, 1, overhead)
        return 1 - sum(lengths) / sum(len(b) * max(lengths[i] for i in b) for b in batches), len(batches)

    (greedy, one), (grouped, count) = padding(None), padding(64)
    assert one == 1 and count > 1
    assert greedy > 0.2 and grouped < greedy / 2, (greedy, grouped)


def test_a_two_step_sft_run_has_the_same_losses_grouped_packed_or_not(tmp_path):
    """The same conversations per step, split or packed otherwise: the loss (a sum over the same
    tokens) and the trained weights agree to float precision, with less padding (none packed)."""
    from helpers.rollout import random_policy
    from safetensors.torch import load_file

    from agentrl.data.records import write_records
    from agentrl.sft.trainer import SftPaths, train_sft

    write_records(_varied_conversations(16), tmp_path / "sft.parquet")
    runs = {}
    for name, overhead, packing in (("greedy", None, False), ("grouped", 64, False), ("packed", None, True)):
        cfg = load_config(
            {
                "sft": {
                    "epochs": 1,
                    "global_batch_size": 8,
                    "micro_batch_size": 8,
                    "micro_batch_overhead_tokens": overhead,
                    "packing": packing,
                    "save_every_steps": 0,
                    "deepspeed": {"zero_stage": 0},
                }
            }
        ).sft
        run = tmp_path / name
        paths = SftPaths(
            random_policy(),
            tmp_path / "sft.parquet",
            run / "model",
            run / "metrics.jsonl",
            run / "ckpt",
            find_deepspeed_config(0),
        )
        train_sft(cfg, 5, paths)
        metrics = [json.loads(line) for line in paths.metrics.read_text().splitlines()]
        runs[name] = metrics, load_file(run / "model" / "model.safetensors")
    greedy, greedy_weights = runs["greedy"]
    assert len(greedy) == 2
    for other in ("grouped", "packed"):
        metrics, weights = runs[other]
        assert len(metrics) == 2
        for a, b in zip(greedy, metrics):
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), other
            assert b["trained_tokens"] == a["trained_tokens"]
            assert b["pad_fraction"] < a["pad_fraction"]
        for name, weight in greedy_weights.items():
            torch.testing.assert_close(weights[name], weight, atol=1e-5, rtol=1e-4, msg=f"{other}: {name}")
    assert all(m["pad_fraction"] == 0 for m in runs["packed"][0])
