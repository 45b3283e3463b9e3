"""Continuous batching and cache reuse in the hf engine; the per-trajectory and per-turn agent loops.

A trained tiny policy makes real tool calls through the real sandbox, so trajectories have
several turns. The per-trajectory loop continues each trajectory's cached keys and values; the
per-turn loop re-prefills the whole conversation every turn: both must give the same token
streams, masks and log-probs for the same seeds (logits agree to float round-off).
"""

from __future__ import annotations

import time

import pytest
import torch
from helpers.rollout import arith_problems, random_policy, trained_policy
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.config import load_config
from agentrl.rollout import AgentLoop, SamplingParams
from agentrl.rollout.engine import Request
from agentrl.rollout.hf_engine import HFEngine
from agentrl.tools.code_interpreter import CodeInterpreter, ToolResult

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def trained():
    model_dir = trained_policy()
    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def _rollouts(policy, interpreter, scheduling: str, batch_size: int = 16, problems: int = 6, n: int = 4):
    model, tokenizer = policy
    cfg = load_config({"rollout": {"max_turns": 4, "max_response_tokens": 400, "scheduling": scheduling}}).rollout
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=batch_size)
    loop = AgentLoop(engine, tokenizer, interpreter, cfg)
    trajectories = loop.run(arith_problems(problems, seed=9), n, SamplingParams(temperature=1.0), seed=3)
    return trajectories, engine.counters, loop.stats


def test_per_trajectory_continues_the_cache_and_samples_what_per_turn_samples(trained, interpreter):
    continued, counters, _ = _rollouts(trained, interpreter, "per_trajectory")
    reread, reread_counters, _ = _rollouts(trained, interpreter, "per_turn")
    assert sum(t.num_turns > 1 for t in continued) >= len(continued) // 2, "the policy should call the tool"
    for a, b in zip(continued, reread, strict=True):
        assert (a.problem_id, a.sample_index) == (b.problem_id, b.sample_index)
        assert a.response_ids == b.response_ids
        assert a.loss_mask == b.loss_mask
        assert a.finish_reason == b.finish_reason and a.tool_calls == b.tool_calls
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    # Each context token computed once: the reused share is what per_turn prefills again.
    assert counters.reused > 0
    assert counters.prefilled < reread_counters.prefilled / 2
    # The n = 4 samples of a prompt share one prefill even in per_turn's first turn.
    prompts = {tuple(t.prompt_ids) for t in continued}
    first_turn = sum(len(p) for p in prompts)
    assert counters.prefilled >= first_turn


def test_results_do_not_depend_on_the_batch_size_or_admission_order(trained, interpreter):
    small, small_counters, _ = _rollouts(trained, interpreter, "per_trajectory", batch_size=3, problems=4, n=2)
    wide, _, _ = _rollouts(trained, interpreter, "per_trajectory", batch_size=64, problems=4, n=2)
    assert [t.response_ids for t in small] == [t.response_ids for t in wide]
    assert small_counters.compactions + small_counters.forwards > 0


def test_an_ended_request_leaves_and_a_queued_one_takes_its_place():
    model_dir = random_policy()
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=2)
    params = SamplingParams(temperature=1.0, seed=1)
    prompt = tokenizer.encode("1 + 1 =", add_special_tokens=False)
    engine.add_request(Request("short", prompt, params.replace(max_tokens=2)))
    engine.add_request(Request("long", prompt, params.replace(max_tokens=40, seed=2)))
    engine.add_request(Request("queued", prompt, params.replace(max_tokens=3, seed=3)))
    finished_at = {}
    steps = 0
    while engine.has_unfinished_requests():
        steps += 1
        for request_id, output in engine.step():
            finished_at[request_id] = (steps, len(output.token_ids), output.finish_reason)
    assert finished_at["short"] == (2, 2, "length")
    # The queued request starts once "short" has left, long before "long" ends.
    assert finished_at["queued"][0] == 2 + 3 and finished_at["queued"][1:] == (3, "length")
    assert finished_at["long"][0] == 40
    # Alone, each request samples what it samples in company (its own seed, its own logits).
    alone = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=1)
    solo = alone.generate([prompt], params.replace(max_tokens=3), seeds=[3])[0]
    engine.add_request(Request("again", prompt, params.replace(max_tokens=3, seed=3)))
    (request_id, output), *_ = [x for _ in range(3) for x in engine.step()]
    assert request_id == "again" and output.token_ids == solo.token_ids


def test_a_session_continues_from_its_parked_cache_with_the_logits_of_a_full_prefill():
    model_dir = random_policy()
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    stop = tokenizer.convert_tokens_to_ids("</tool_call>")
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop,))
    prompt = tokenizer.encode("Compute 12 * 7.", add_special_tokens=False)
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=4)
    engine.add_request(Request("turn0", prompt, params, session="s"))
    (_, first), *_ = [x for _ in range(12) for x in engine.step()]
    context = prompt + first.token_ids + tokenizer.encode(" tool says 84.", add_special_tokens=False)
    before = engine.counters.prefilled
    engine.add_request(Request("turn1", context, params, session="s"))
    continued = [x for _ in range(12) for x in engine.step()][0][1]
    fresh = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=4).generate([context], params)[0]
    if first.finish_reason == "stop":
        # Only the new tokens (and the last sampled one, never fed) are prefilled.
        assert engine.counters.prefilled - before == len(context) - len(prompt) - len(first.token_ids) + 1
    assert continued.token_ids == fresh.token_ids
    assert torch.allclose(torch.tensor(continued.logprobs), torch.tensor(fresh.logprobs), atol=1e-5)


class SlowTool:
    """A code interpreter whose every call sleeps ``delay_s`` (slow model-written code), in threads."""

    def __init__(self, interpreter: CodeInterpreter, delay_s: float):
        self.interpreter = interpreter
        self.delay_s = delay_s

    def _slow(self, code) -> ToolResult:
        time.sleep(self.delay_s)
        return self.interpreter.execute(code)

    def submit(self, code):
        from concurrent.futures import ThreadPoolExecutor

        return ThreadPoolExecutor(max_workers=1).submit(self._slow, code)

    def execute_many(self, codes):
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max(1, len(codes))) as pool:
            return list(pool.map(self._slow, codes))


def test_a_slow_tool_does_not_hold_back_the_other_trajectories(trained, interpreter):
    model, tokenizer = trained
    cfg = load_config({"rollout": {"max_turns": 4, "max_response_tokens": 400}}).rollout
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=16)
    loop = AgentLoop(engine, tokenizer, SlowTool(interpreter, delay_s=0.5), cfg)
    started = time.perf_counter()
    trajectories = loop.run(arith_problems(4, seed=9), 4, SamplingParams(temperature=1.0), seed=3)
    wall = time.perf_counter() - started
    calls = sum(len(t.tool_calls) for t in trajectories)
    assert calls >= 4
    # Decoding went on while tools slept: the loop waited for tools with nothing to decode for
    # less than the tools slept in total, and the engine time overlapped the sleeps.
    assert loop.stats.tools_s < 0.5 * calls
    assert loop.stats.generate_s + loop.stats.tools_s <= wall + 0.05


def test_the_in_place_cache_and_cpu_gqa_attention_give_transformers_logits():
    from transformers import DynamicCache

    from agentrl.rollout.hf_cache import ATTENTION, batch_cache, use_cpu_gqa_attention

    model_dir = random_policy()
    reference = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    use_cpu_gqa_attention(model)
    # Grouped-query heads (2 query heads per key/value head): the path that skips repeat_kv is the one run.
    assert model.config._attn_implementation == ATTENTION
    assert model.config.num_attention_heads > model.config.num_key_value_heads
    torch.manual_seed(0)
    ids = torch.randint(3, 200, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    mask[1, 5] = 0  # a hole, as merged rows have
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    ours, theirs = batch_cache(num_layers=model.config.num_hidden_layers), DynamicCache(config=reference.config)
    with torch.inference_mode():
        a = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=ours).logits
        b = reference(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=theirs).logits
        keep = torch.tensor([2, 0])
        ours.batch_select_indices(keep)
        theirs.batch_select_indices(keep)
        for step in range(40):  # past the first buffer's spare room: it grows
            token = torch.randint(3, 200, (2, 1))
            mask2 = torch.cat([mask[keep], torch.ones((2, step + 1), dtype=torch.long)], dim=1)
            position = positions[keep][:, -1:] + step + 1
            a2 = model(input_ids=token, attention_mask=mask2, position_ids=position, past_key_values=ours).logits
            b2 = reference(input_ids=token, attention_mask=mask2, position_ids=position, past_key_values=theirs).logits
            assert torch.allclose(a2, b2, atol=1e-5), step
    valid = mask.bool()
    assert torch.allclose(a[valid], b[valid], atol=1e-5)
    assert ours.get_seq_length() == theirs.get_seq_length() == 9 + 40


@pytest.mark.parametrize("scheduling", ["per_trajectory", "per_turn"])
def test_streaming_a_problem_set_keeps_a_window_and_samples_what_run_samples(trained, interpreter, scheduling):
    model, tokenizer = trained
    cfg = load_config({"rollout": {"max_turns": 4, "max_response_tokens": 400, "scheduling": scheduling}}).rollout
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=16)
    loop = AgentLoop(engine, tokenizer, interpreter, cfg)
    problems = arith_problems(7, seed=9)
    params = SamplingParams(temperature=1.0)
    whole = loop.run(problems, 2, params, seed=3)
    admitted, handed = [], []
    original = loop.prompt_ids

    def counted(problem):
        admitted.append((problem.id, len(handed)))
        return original(problem)

    loop.prompt_ids = counted
    loop.stream(problems, 2, params, 3, lambda t: handed.append(t), max_problems_in_flight=3)
    by_problem = {group[0].problem_id: [t.response_ids for t in group] for group in handed}
    assert sorted(by_problem) == sorted(p.id for p in problems)
    for problem in problems:
        assert by_problem[problem.id] == [t.response_ids for t in whole if t.problem_id == problem.id]
    # Never more than 3 problems in flight: problem k starts only after k - 3 have been handed over.
    assert all(started_after >= index - 3 for index, (_, started_after) in enumerate(admitted))
    assert any(started_after > 0 for _, started_after in admitted)
