"""Stitched SFT trajectories (the data ablation): same problems as the real data, answers written
before any tool output, real tool outputs spliced in that the following text does not read."""

from __future__ import annotations

import random
import re

import pandas as pd
import pytest

from agentrl.config import ConfigError, EmbeddedDataConfig, load_config
from agentrl.data import embedded
from agentrl.data.cli import prepare
from agentrl.data.records import read_sft_examples
from agentrl.data.stitched import StitchedSolver, hand_steps

SHARE = 0.5


def _generate(interpreter_and_sandbox, writer, direct=0.0):
    tool, sandbox = interpreter_and_sandbox
    setup = EmbeddedDataConfig(
        families=("arith", "choice", "program"),
        sft_per_family=12,
        rl_pool_per_family=8,
        eval_per_family=6,
        failed_attempt_share=SHARE,
        direct_answer_share=direct,
        prompt_style="compact",
        sft_trajectories="real",  # the writer is passed below
        reasoning_mode="plain",
    )
    return embedded.generate(
        setup,
        3,
        execute=lambda code: tool.execute(code).text,
        run_program=lambda jobs: [r.stdout for r in sandbox.run_many(jobs)],
        trajectory_writer=writer,
    )


@pytest.fixture(scope="module")
def pair(interpreter_and_sandbox):
    """(real, stitched) datasets from the same seed."""
    return _generate(interpreter_and_sandbox, embedded.ScriptedSolver), _generate(
        interpreter_and_sandbox, StitchedSolver
    )


def _calls(example):
    return [m for m in example.messages if m.get("tool_calls")]


def _tool_outputs(example):
    return [m["content"] for m in example.messages if m["role"] == "tool"]


def _choice_letter(prompt):
    line = prompt.split("?\n")[1].split("\nUse the code tool")[0]
    options = eval(f"dict({line})")
    value = eval(prompt.split("Which option equals ")[1].split("?")[0])
    return next(k for k in options if options[k] == value)


def _answer_marker(example):
    """What gives the answer away in the text, read off the compact prompt: the expression's value
    (arith), "option <letter>" (choice) or the example's expected output (program)."""
    prompt = example.messages[0]["content"]
    family = example.id.split("-")[0]
    if family == "arith":
        return str(eval(prompt.split("Compute ")[1].split(". Use")[0]))
    if family == "choice":
        return f"option {_choice_letter(prompt)}"
    return prompt.split("Example output:\n")[1].split("\nTest it")[0]


def _printed_answer(example):
    """What a successful call prints: the marker, or for choice the list of matching letters."""
    if example.id.startswith("choice"):
        return str([_choice_letter(example.messages[0]["content"])])
    return _answer_marker(example)


def _last_line(text):
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --------------------------------------------------------------------------- hand evaluation
def test_hand_steps_follow_evaluation_order():
    assert hand_steps("(12 + 3) * 4 - 5") == (["12 + 3 = 15", "15 * 4 = 60", "60 - 5 = 55"], 55)
    assert hand_steps("51 + 34 * 40") == (["34 * 40 = 1360", "51 + 1360 = 1411"], 1411)
    assert hand_steps("-3 * 4") == (["-3 * 4 = -12"], -12)
    assert hand_steps("7") == ([], 7)


def test_hand_steps_agree_with_python_on_every_embedded_level():
    rng = random.Random(0)
    for _ in range(300):
        expression = embedded._arith_expression(rng, rng.randint(1, 5))
        steps, value = hand_steps(expression)
        assert value == eval(expression), expression
        assert steps and steps[-1].endswith(f"= {value}"), (expression, steps)


@pytest.mark.parametrize("expression", ["2 ** 3", "x + 1", "1.5 * 2", "print(3)", "3 +"])
def test_hand_steps_refuse_what_they_cannot_work_out(expression):
    with pytest.raises(ValueError, match=re.escape(repr(expression))):
        hand_steps(expression)


# --------------------------------------------------------------------------- the data sets
def test_same_problems_prompts_and_final_answers_as_the_real_data(pair):
    real, stitched = pair
    assert [p.to_row() for p in stitched.rl_pool] == [p.to_row() for p in real.rl_pool]
    assert {k: [p.to_row() for p in v] for k, v in stitched.eval_sets.items()} == {
        k: [p.to_row() for p in v] for k, v in real.eval_sets.items()
    }
    assert [e.id for e in stitched.sft] == [e.id for e in real.sft]
    for r, s in zip(real.sft, stitched.sft):
        assert s.messages[0] == r.messages[0], r.id
        # The conclusion is the real data's (correct) answer, word for word.
        assert s.messages[-1] == r.messages[-1], r.id
        assert s.tools == r.tools


def test_each_stitched_trajectory_states_its_answer_before_any_tool_output(pair):
    _, stitched = pair
    for example in stitched.sft:
        calls = _calls(example)
        assert len(calls) == 1, f"{example.id}: a stitched trajectory makes exactly one call"
        assert [m["role"] for m in example.messages] == ["user", "assistant", "tool", "assistant"], example.id
        marker = _answer_marker(example)
        assert marker in calls[0]["content"], f"{example.id}: {marker!r} not in the pre-written text"


def test_real_trajectories_never_state_the_answer_before_the_tool_printed_it(pair):
    """The contrast that makes the ablation: in real data the answer comes from the output."""
    real, _ = pair
    for example in real.sft:
        if example.id.startswith("program"):
            continue  # the expected output is in the prompt; the real solver never restates it first
        marker = _answer_marker(example)
        last_tool = max(i for i, m in enumerate(example.messages) if m["role"] == "tool")
        before = [m["content"] for m in example.messages[1:last_tool] if m["role"] == "assistant"]
        assert not any(marker in text for text in before), example.id
        assert _last_line(example.messages[last_tool]["content"]) == _printed_answer(example), example.id


def test_after_a_failed_call_the_text_goes_on_as_pre_written(pair):
    real, stitched = pair
    contradicted = []
    for r, s in zip(real.sft, stitched.sft):
        if _last_line(_tool_outputs(s)[0]) != _printed_answer(s):
            contradicted.append(s.id)
            # The output did not show the answer, yet the text goes on to the pre-written
            # conclusion (the real data's final turn, reached there only after a recovery).
            assert s.messages[-1] == r.messages[-1]
    recovering = [r.id for r in real.sft if len(_calls(r)) > 1]
    # The same random draws: exactly the problems that recover in the real data are contradicted here.
    assert contradicted == recovering
    assert 0.2 < len(contradicted) / len(stitched.sft) < 0.8


def test_the_same_problems_are_answered_without_the_tool_in_both_data_sets(interpreter_and_sandbox):
    """direct_answer_share: nothing is stitched into a trajectory without a call, so the two sets
    hold the very same direct answers, and the others still pair up call for call."""
    real = _generate(interpreter_and_sandbox, embedded.ScriptedSolver, direct=0.5)
    stitched = _generate(interpreter_and_sandbox, StitchedSolver, direct=0.5)
    real_direct = [e for e in real.sft if not _calls(e)]
    assert real_direct, "share 0.5 of 12 arith trajectories: some answer directly"
    assert [e.messages for e in real_direct] == [e.messages for e in stitched.sft if not _calls(e)]
    for r, s in zip(real.sft, stitched.sft):
        assert bool(_calls(r)) == bool(_calls(s)), r.id
        assert s.messages[-1] == r.messages[-1], r.id


def test_spliced_outputs_are_the_real_outputs_of_their_code(interpreter_and_sandbox, pair):
    tool, _ = interpreter_and_sandbox
    _, stitched = pair
    codes = [_calls(e)[0]["tool_calls"][0]["function"]["arguments"]["code"] for e in stitched.sft]
    assert [r.text for r in tool.execute_many(codes)] == [_tool_outputs(e)[0] for e in stitched.sft]


# --------------------------------------------------------------------------- prepare-data
def test_prepare_data_writes_stitched_trajectories_when_configured(tmp_path):
    small = {
        "embedded": {
            "families": ["arith", "program"],
            "sft_per_family": 4,
            "rl_pool_per_family": 3,
            "eval_per_family": 2,
            "failed_attempt_share": 0.0,
            "direct_answer_share": 0.0,
        }
    }
    written = {}
    for kind in ("real", "stitched"):
        cfg = load_config(
            {"data": {"embedded": {**small["embedded"], "sft_trajectories": kind}}, "sandbox": {"workers": 2}}
        )
        out = tmp_path / kind
        counts = prepare(cfg, out / "sft.parquet", out / "rl_pool.parquet", out / "eval")
        assert counts == {"sft": 8, "rl_pool": 6, "eval/arith": 2, "eval/program": 2}
        written[kind] = read_sft_examples(out / "sft.parquet")
    assert all(e.messages[1]["content"].startswith("Let me") for e in written["real"] if e.id.startswith("arith"))
    assert all(
        e.messages[1]["content"].startswith("By hand: ") for e in written["stitched"] if e.id.startswith("arith")
    )
    assert pd.read_parquet(tmp_path / "real" / "rl_pool.parquet").equals(
        pd.read_parquet(tmp_path / "stitched" / "rl_pool.parquet")
    )


def test_an_unknown_trajectory_kind_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="data.embedded.sft_trajectories"):
        load_config({"data": {"embedded": {"sft_trajectories": "synthetic"}}})
