"""The embedded task: deterministic, three families, disjoint splits, real end-to-end trajectories."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from agentrl.config import EmbeddedDataConfig
from agentrl.data import embedded


def _generate(interpreter_and_sandbox, seed=0, per_family=12, share=0.5, direct=0.0):
    tool, sandbox = interpreter_and_sandbox
    setup = EmbeddedDataConfig(
        families=("arith", "choice", "program"),
        sft_per_family=per_family,
        rl_pool_per_family=per_family * 2,
        eval_per_family=per_family,
        failed_attempt_share=share,
        direct_answer_share=direct,
        prompt_style="compact",
        sft_trajectories="real",
        reasoning_mode="plain",
    )
    return embedded.generate(
        setup,
        seed,
        execute=lambda code: tool.execute(code).text,
        run_program=lambda jobs: [r.stdout for r in sandbox.run_many(jobs)],
    )


@pytest.fixture(scope="module")
def dataset(interpreter_and_sandbox):
    return _generate(interpreter_and_sandbox)


def test_deterministic_from_the_seed(interpreter_and_sandbox, dataset):
    again = _generate(interpreter_and_sandbox)
    assert [e.to_row() for e in again.sft] == [e.to_row() for e in dataset.sft]
    assert [p.to_row() for p in again.rl_pool] == [p.to_row() for p in dataset.rl_pool]
    other = _generate(interpreter_and_sandbox, seed=1)
    assert [p.prompt for p in other.rl_pool] != [p.prompt for p in dataset.rl_pool]


def test_families_sizes_and_data_sources(dataset):
    assert {k: len(v) for k, v in dataset.eval_sets.items()} == {"arith": 12, "choice": 12, "program": 12}
    assert Counter(p.data_source for p in dataset.rl_pool) == {
        "embedded-arith": 24,
        "embedded-choice": 24,
        "embedded-code": 24,
    }
    assert len(dataset.sft) == 36
    choice = dataset.eval_sets["choice"][0]
    assert choice.ground_truth in ("A", "B", "C", "D")
    program = dataset.eval_sets["program"][0]
    assert len(program.ground_truth["inputs"]) == len(program.ground_truth["outputs"]) == embedded.NUM_CODE_CASES


def test_eval_problems_never_appear_in_training_splits(dataset):
    eval_prompts = {p.prompt[0]["content"] for problems in dataset.eval_sets.values() for p in problems}
    train_prompts = {p.prompt[0]["content"] for p in dataset.rl_pool}
    train_prompts |= {e.messages[0]["content"] for e in dataset.sft}
    assert not eval_prompts & train_prompts


def test_difficulty_varies_within_each_family(dataset):
    for family in ("arith", "choice", "program"):
        levels = {p.extra["level"] for p in dataset.rl_pool if p.extra["family"] == family}
        assert len(levels) >= 3, f"{family}: levels {levels}"


@pytest.mark.parametrize("level", range(1, embedded.ARITH_LEVELS + 1))
def test_arith_levels_grow_in_operands_and_keep_answers_short(level):
    """Levels 1-3 have 2 operands, 4-5 three, 6-7 four, 8 five; at most two products, so every
    answer has at most 10 characters; levels 5 and 7 bracket their first pair."""
    import random

    rng = random.Random(level)
    expressions = [embedded._arith_expression(rng, level) for _ in range(500)]
    operands = {len(re.findall(r"\d+", e)) for e in expressions}
    assert operands == {2 if level <= 3 else 3 if level <= 5 else 4 if level <= 7 else 5}, operands
    assert max(e.count("*") for e in expressions) <= 2
    assert max(len(str(eval(e))) for e in expressions) <= 10
    assert all(e.startswith("(") for e in expressions) == (level in (5, 7))
    assert all("(" not in e for e in expressions) == (level not in (5, 7))


def test_arith_answers_are_the_true_values(dataset):
    for problem in dataset.eval_sets["arith"]:
        expression = problem.prompt[0]["content"].split("Compute ")[1].split(". Use")[0]
        assert problem.ground_truth == str(eval(expression))


def test_share_of_trajectories_recover_from_a_failed_attempt(dataset):
    recovering = [e for e in dataset.sft if sum(1 for m in e.messages if m.get("tool_calls")) > 1]
    assert 0.2 < len(recovering) / len(dataset.sft) < 0.8
    errors = [m["content"] for e in recovering for m in e.messages if m["role"] == "tool"]
    assert any("NameError" in text for text in errors) or any(text == "" for text in errors)


def test_a_share_of_arith_trajectories_answer_without_the_tool(interpreter_and_sandbox, dataset):
    """direct_answer_share: those trajectories are one assistant turn with the true value in the words
    the tool-using ones end with; choice and program trajectories always call; share 0 draws none."""
    assert all(_calls_of(e) for e in dataset.sft), "share 0: every trajectory calls the tool"
    direct_data = _generate(interpreter_and_sandbox, per_family=40, direct=0.5)
    direct = [e for e in direct_data.sft if not _calls_of(e)]
    assert {e.id.split("-")[0] for e in direct} == {"arith"}
    assert 0.3 < len(direct) / 40 < 0.7
    tool_using = [e for e in direct_data.sft if e.id.startswith("arith") and _calls_of(e)]
    for example in direct:
        assert [m["role"] for m in example.messages] == ["user", "assistant"], example.id
        value = eval(example.messages[0]["content"].split("Compute ")[1].split(". Use")[0])
        assert example.messages[1]["content"] == f"The result is {value}.\n\\boxed{{{value}}}"
    # The same closing words as the tool-using trajectories: only the first turn's start differs.
    assert all(e.messages[-1]["content"].startswith("The result is ") for e in tool_using)
    with pytest.raises(ValueError, match="only arith"):
        embedded.direct_answer(embedded.Draft("choice", "k", {}, "A", 1))


def _calls_of(example):
    return [m for m in example.messages if m.get("tool_calls")]


def test_trajectories_replayed_through_the_sandbox_reproduce_their_tool_outputs(interpreter_and_sandbox, dataset):
    tool, _ = interpreter_and_sandbox
    for example in dataset.sft:
        calls = [m["tool_calls"][0]["function"]["arguments"]["code"] for m in example.messages if m.get("tool_calls")]
        recorded = [m["content"] for m in example.messages if m["role"] == "tool"]
        assert [r.text for r in tool.execute_many(calls)] == recorded, example.id


def test_final_answers_come_from_the_tool_output(dataset):
    for example in dataset.sft:
        final = example.messages[-1]["content"]
        last_tool = [m["content"] for m in example.messages if m["role"] == "tool"][-1].strip()
        if example.id.startswith("arith"):
            assert final.endswith(f"\\boxed{{{last_tool}}}")
        if example.id.startswith("choice"):
            # The tool printed the list of matching letters; the answer boxes that one letter.
            assert re.fullmatch(r"\['[ABCD]'\]", last_tool), example.id
            assert final.endswith(f"\\boxed{{{last_tool[2]}}}")
        if example.id.startswith("program"):
            assert "```python\n" in final


def test_tool_call_arguments_are_json_objects_with_code(dataset):
    for example in dataset.sft:
        for message in example.messages:
            for call in message.get("tool_calls", []):
                assert call["function"]["name"] == "code_interpreter"
                assert isinstance(call["function"]["arguments"]["code"], str)
                json.dumps(call)


def test_choice_options_are_distinct_near_misses_and_valid_inside_dict(dataset):
    """``A=-26, B=-21, ...``: four different values within 9 of the answer, and the line is the
    keyword arguments of ``dict(...)`` (the solver's code copies it verbatim)."""
    for problem in dataset.eval_sets["choice"] + [p for p in dataset.rl_pool if p.data_source == "embedded-choice"]:
        content = problem.prompt[0]["content"]
        expression = content.split("Which option equals ")[1].split("?")[0]
        line = content.split("?\n")[1].split("\nUse the code tool")[0]
        options = eval(f"dict({line})")
        assert list(options) == ["A", "B", "C", "D"], content
        value = eval(expression)
        assert [k for k in options if options[k] == value] == [problem.ground_truth]
        assert len(set(options.values())) == 4 and all(abs(v - value) <= 9 for v in options.values())
        assert embedded.option_letters(line) == {str(v): k for k, v in options.items()}


def test_option_letters_names_the_malformed_option():
    with pytest.raises(ValueError, match="'E=3'"):
        embedded.option_letters("A=1, E=3")
    with pytest.raises(ValueError, match="'B: 2'"):
        embedded.option_letters("A=1, B: 2")
    with pytest.raises(ValueError, match="'AB=3'"):
        embedded.option_letters("A=1, AB=3")
