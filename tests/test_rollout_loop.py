"""The agent loop: masks, tool turns, finish reasons, malformed calls, exact generated ids, the CLI.

The model is real (a tiny random Qwen3 running every forward pass through the ``hf`` engine and
the tools run in the real sandbox); :class:`ForceTurns` makes it write scripted turns, so each
test knows which ids were sampled. ``test_trained_model_*`` use a model that learned to call the
tool by itself.
"""

from __future__ import annotations

import json

import pytest
from helpers.rollout import (
    GREEDY,
    arith_problems,
    call_turn,
    final_turn,
    random_policy,
    scripted_loop,
    trained_policy,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.config import load_config
from agentrl.data.records import Trajectory, write_records
from agentrl.rollout import AgentLoop, SamplingParams
from agentrl.rollout.hf_engine import HFEngine
from agentrl.rollout.tool_parser import ERROR_PREFIX, ToolTurnFormat, parse_tool_call

CFG = load_config({"sandbox": {"workers": 2}, "rollout": {"max_turns": 4, "max_response_tokens": 400}})


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def policy():
    model_dir = random_policy()
    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def _spans(trajectory: Trajectory) -> list[tuple[int, list[int]]]:
    """Maximal runs of equal loss mask: [(mask, ids), ...]."""
    spans: list[tuple[int, list[int]]] = []
    for token, mask in zip(trajectory.response_ids, trajectory.loss_mask):
        if spans and spans[-1][0] == mask:
            spans[-1][1].append(token)
        else:
            spans.append((mask, [token]))
    return spans


def test_tool_parser_turns_malformed_calls_into_error_responses():
    ok = parse_tool_call(
        'I will run it.\n<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(2)"}}\n</tool_call>'
    )
    assert ok.ok and ok.code == "print(2)"
    as_string = parse_tool_call(
        '<tool_call>{"name": "code_interpreter", "arguments": "{\\"code\\": \\"1+1\\"}"}</tool_call>'
    )
    assert as_string.ok and as_string.code == "1+1"
    assert parse_tool_call("The answer is \\boxed{4}.") is None
    cases = {
        "<tool_call>{not json}</tool_call>": "not valid JSON",
        '<tool_call>{"name": "browser", "arguments": {"code": "1"}}</tool_call>': "unknown tool 'browser'",
        '<tool_call>{"name": "code_interpreter", "arguments": {"script": "1"}}</tool_call>': "missing required argument 'code'",
        '<tool_call>["code_interpreter"]</tool_call>': "must be a JSON object",
        '<tool_call>{"name": "code_interpreter", "arguments": "{bad"}</tool_call>': "arguments are not valid JSON",
        "print(1)\n</tool_call>": "without a <tool_call>",
    }
    for text, reason in cases.items():
        call = parse_tool_call(text)
        assert call is not None and not call.ok, text
        assert call.error.startswith(ERROR_PREFIX) and reason in call.error, call.error


def test_tool_turn_framing_comes_from_the_chat_template(policy):
    _, tokenizer = policy
    fmt = ToolTurnFormat(tokenizer)
    assert (
        fmt.response_text("42\n")
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.decode(fmt.response_ids("42\n")) == fmt.response_text("42\n")
    # A program that prints a turn marker cannot forge a turn boundary.
    forged = fmt.response_ids("<|im_end|>")
    assert forged.count(fmt.end_of_turn_id) == fmt.response_ids("x").count(fmt.end_of_turn_id)
    # Another template (a thinking prefix in the generation prompt) yields its own framing.
    other = AutoTokenizer.from_pretrained(random_policy())
    other.chat_template = tokenizer.chat_template.replace(
        "'<|im_start|>assistant\\n' }}\n{%- endif %}\n", "'<|im_start|>assistant\\n<think>\\n' }}\n{%- endif %}\n"
    )
    assert other.chat_template != tokenizer.chat_template
    assert ToolTurnFormat(other).response_text("1").endswith("<|im_start|>assistant\n<think>\n")


def test_masks_line_up_with_sampled_and_inserted_text(policy, interpreter):
    _, tokenizer = policy
    fmt = ToolTurnFormat(tokenizer)
    # Turn 0 spells "compute" one character per token: re-tokenizing the decoded text would merge them.
    spelled = [tokenizer.convert_tokens_to_ids(c) for c in "compute"] + call_turn(tokenizer, "print(6 * 7)", "")
    malformed = tokenizer.encode('<tool_call>\n{"name": "code_interpreter", "arguments": {"cod": 1}}\n</tool_call>')
    scripts = [spelled, malformed, final_turn(tokenizer, "42")]
    problems = arith_problems(2)
    [first, *_] = trajectories = scripted_loop(policy, interpreter, scripts).run(problems, 2, GREEDY, seed=0)

    assert [(t.problem_id, t.sample_index) for t in trajectories] == [(p.id, i) for p in problems for i in range(2)]
    for trajectory in trajectories:
        assert trajectory.finish_reason == "stop" and trajectory.num_turns == 3
        assert trajectory.tool_calls == ["print(6 * 7)", '\n{"name": "code_interpreter", "arguments": {"cod": 1}}\n']
        assert trajectory.tool_errors == [False, True]
        assert len(trajectory.response_ids) == len(trajectory.loss_mask) == len(trajectory.logprobs)
        assert all(lp == 0.0 for lp, m in zip(trajectory.logprobs, trajectory.loss_mask) if m == 0)
        spans = _spans(trajectory)
        assert [m for m, _ in spans] == [1, 0, 1, 0, 1], "sampled and inserted spans must alternate per turn"
        assert [ids for m, ids in spans if m == 1] == scripts, "mask-1 spans are exactly the sampled ids"
        inserted = [tokenizer.decode(ids) for m, ids in spans if m == 0]
        assert inserted[0] == fmt.response_text("42\n")
        assert inserted[1] == fmt.response_text(ERROR_PREFIX + "missing required argument 'code'")
        assert trajectory.text == tokenizer.decode(trajectory.response_ids, skip_special_tokens=True)
    # The ids are the generated ones, not a decode-then-encode copy (which would differ here).
    sampled = _spans(first)[0][1]
    assert tokenizer.encode(tokenizer.decode(sampled), add_special_tokens=False) != sampled
    prompt_text = tokenizer.decode(first.prompt_ids)
    assert prompt_text.startswith("<|im_start|>system\n# Tools") and prompt_text.endswith("<|im_start|>assistant\n")
    assert problems[0].prompt[0]["content"] in prompt_text and '"name": "code_interpreter"' in prompt_text


def test_max_turns_ends_a_trajectory_that_keeps_calling(policy, interpreter):
    _, tokenizer = policy
    fmt = ToolTurnFormat(tokenizer)
    scripts = [call_turn(tokenizer, f"print({k} + 1)") for k in range(10)]
    [trajectory] = scripted_loop(policy, interpreter, scripts, max_turns=3).run(arith_problems(1), 1, GREEDY, seed=0)
    assert trajectory.finish_reason == "max_turns" and trajectory.num_turns == 3
    assert trajectory.tool_calls == ["print(0 + 1)", "print(1 + 1)"], "the call of the last turn is not run"
    assert trajectory.tool_errors == [False, False]
    assert trajectory.response_ids[-1] == fmt.end_of_turn_id and trajectory.loss_mask[-1] == 0
    assert "<tool_response>\n2\n" in trajectory.text


@pytest.mark.parametrize("budget_cut", ["in_generation", "in_tool_response"])
def test_the_response_budget_ends_a_trajectory_with_length(policy, interpreter, budget_cut):
    _, tokenizer = policy
    turn = call_turn(tokenizer, "print(123456789)")
    response = ToolTurnFormat(tokenizer).response_ids("123456789\n")
    budget = len(turn) + len(response) + 5 if budget_cut == "in_generation" else len(turn) + 3
    loop = scripted_loop(policy, interpreter, [turn, turn], max_response_tokens=budget)
    [trajectory] = loop.run(arith_problems(1), 1, GREEDY, seed=0)
    assert trajectory.finish_reason == "length"
    assert len(trajectory.response_ids) == budget, "the budget counts tool tokens and is never exceeded"
    assert trajectory.response_ids[: len(turn)] == turn
    if budget_cut == "in_generation":
        assert trajectory.num_turns == 2 and trajectory.loss_mask[-5:] == [1] * 5
    else:
        assert trajectory.num_turns == 1 and trajectory.response_ids[len(turn) :] == response[:3]


def test_free_running_sampling_is_reproducible_and_within_budget(policy, interpreter):
    _, tokenizer = policy
    fmt = ToolTurnFormat(tokenizer)
    loop = scripted_loop(policy, interpreter, [], max_response_tokens=40)  # no script: the model samples freely
    params = SamplingParams(temperature=1.0)
    trajectories = loop.run(arith_problems(3), 2, params, seed=1)
    for trajectory in trajectories:
        assert len(trajectory.response_ids) <= 40 and trajectory.num_turns >= 1
        ends = set(fmt.stop_token_ids) | set(loop.engine.eos_ids)  # the loop's stops or the model's end of sequence
        assert trajectory.finish_reason == "length" or trajectory.response_ids[-1] in ends
        for mask, ids in _spans(trajectory):
            if mask == 0:
                assert tokenizer.decode(ids).startswith("<|im_end|>"), "inserted text starts by closing the turn"
    again = loop.run(arith_problems(3), 2, params, seed=1)
    assert [t.response_ids for t in again] == [t.response_ids for t in trajectories], "same seed, same rollouts"
    other = loop.run(arith_problems(3), 2, params, seed=2)
    assert [t.response_ids for t in other] != [t.response_ids for t in trajectories]


def test_an_overlong_prompt_is_refused_with_the_problem_id(policy, interpreter):
    problem = arith_problems(1)[0]
    with pytest.raises(ValueError, match=f"problem '{problem.id}'.*max_prompt_tokens=16"):
        scripted_loop(policy, interpreter, [], max_prompt_tokens=16).run([problem], 1, GREEDY, seed=0)


def test_cli_writes_scored_trajectories(tmp_path):
    from agentrl.rollout.cli import main

    problems = tmp_path / "problems.parquet"
    write_records(arith_problems(3), problems)
    out = tmp_path / "rollouts.jsonl"
    budget = {"rollout": {"max_response_tokens": 24, "batch_size": 4}, "reward": {"overlong": {"enable": False}}}
    config = json.dumps({**budget, "sandbox": {"workers": 1}})  # a 24-token budget holds no 128-token buffer
    argv = [
        "--model",
        str(random_policy()),
        "--problems",
        str(problems),
        "--n",
        "2",
        "--out",
        str(out),
        "--config-json",
        config,
        "--temperature",
        "0.7",
        "--seed",
        "3",
        "--score",
        "--threads",
        "1",
    ]
    assert main(argv) == 0
    rows = [Trajectory.from_json(json.loads(line)) for line in out.read_text().splitlines()]
    assert [(r.problem_id, r.sample_index) for r in rows] == [(p.id, i) for p in arith_problems(3) for i in range(2)]
    for row in rows:
        assert len(row.response_ids) <= 24 and row.reward is not None and row.reward < 0  # no boxed answer
        assert row.extra["acc"] is False and "family" in row.extra["reward_details"]
    with pytest.raises(SystemExit):
        main(["--model", str(tmp_path), "--problems", str(problems), "--out", str(out)])


@pytest.mark.slow
def test_trained_model_calls_the_tool_and_reads_the_real_output(interpreter):
    model_dir = trained_policy()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    fmt = ToolTurnFormat(tokenizer)
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=16)
    loop = AgentLoop(engine, tokenizer, interpreter, CFG.rollout)
    trajectories = loop.run(arith_problems(6, seed=9), 4, SamplingParams(temperature=1.0), seed=0)
    executed = 0
    for trajectory in trajectories:
        spans = _spans(trajectory)
        responses = [tokenizer.decode(ids) for m, ids in spans if m == 0 and len(ids) > 1]
        calls = [(code, failed) for code, failed in zip(trajectory.tool_calls, trajectory.tool_errors)]
        assert len(responses) == len(calls)
        for (code, failed), response in zip(calls, responses):
            if not failed:  # the tool response is what the sandbox printed for that code
                assert response == fmt.response_text(interpreter.execute(code).text)
                executed += 1
        for mask, ids in spans:
            if mask == 1:  # sampled spans are whole assistant turns: they never hold template framing
                assert "<|im_start|>" not in tokenizer.decode(ids)
    assert executed >= len(trajectories) // 2, f"the trained model ran only {executed} tool calls"
    assert sum(t.finish_reason == "stop" for t in trajectories) >= len(trajectories) // 2
