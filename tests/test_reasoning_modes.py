"""The reasoning ablation's SFT data (agentrl.data.reasoning_modes): the same real trajectories,
deliberative (a plan, then one computing call) or reactive (one call per operation), with the
plain mode's data unchanged, every answer right, and the report's classifier agreeing.

Token counts use a tokenizer built as the pipeline builds the embedded one
(agentrl.model.build.train_tokenizer on the rendered plain conversations, the default's vocabulary
size and tool header), trained here on the small generation below rather than the default's 1200
conversations; the module docstring gives the lengths measured with the default run's own tokenizer.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import random

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.data import embedded
from agentrl.data.cli import prepare
from agentrl.data.embedded import Draft
from agentrl.data.reasoning_modes import WRITERS, DeliberativeSolver, ReactiveSolver, operation_steps
from agentrl.data.records import Problem, read_sft_examples
from agentrl.model.build import train_tokenizer
from agentrl.sampling.metrics import SampleRecord, reasoning_mode
from agentrl.sampling.samples import generated_spans, tokens_before_marker
from agentrl.sft.masking import render_with_assistant_mask

DEFAULTS = load_config({})
# The generation the plain digest was taken of, on the code before the reasoning modes existed
# (commit 67009f6): seed 3, 12 SFT problems per family, shares 0.5 (failed attempt) and 0.3 (direct).
SETUP = dataclasses.replace(
    DEFAULTS.data.embedded,
    sft_per_family=12,
    rl_pool_per_family=4,
    eval_per_family=4,
    failed_attempt_share=0.5,
    direct_answer_share=0.3,
)
SEED = 3
PLAIN_DIGEST = "3ff2957d200e223d2f358ab61173b9ecd79493f44b12f752cb33542b75c0ac81"


def _digest(examples) -> str:
    text = "\n".join(json.dumps(e.to_row(), sort_keys=True) for e in examples)
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def by_mode(interpreter_and_sandbox):
    """mode -> the SFT examples of SETUP written in that mode, through the real tool."""
    tool, sandbox = interpreter_and_sandbox
    return {
        mode: embedded.generate(
            SETUP,
            SEED,
            execute=lambda code: tool.execute(code).text,
            run_program=lambda jobs: [r.stdout for r in sandbox.run_many(jobs)],
            trajectory_writer=writer,
        ).sft
        for mode, writer in WRITERS.items()
    }


@pytest.fixture(scope="module")
def tokenizer(by_mode):
    renderer = train_tokenizer(["0123456789"], 300, DEFAULTS.model.embedded.tool_header)
    corpus = [renderer.apply_chat_template(e.messages, tools=e.tools, tokenize=False) for e in by_mode["plain"]]
    return train_tokenizer(corpus, DEFAULTS.model.embedded.vocab_size, DEFAULTS.model.embedded.tool_header)


def _calls(example) -> list[str]:
    return [m["tool_calls"][0]["function"]["arguments"]["code"] for m in example.messages if m.get("tool_calls")]


def _outputs(example) -> list[str]:
    return [m["content"] for m in example.messages if m["role"] == "tool"]


def _expression(example) -> str:
    prompt = example.messages[0]["content"]
    if example.id.startswith("arith"):
        return prompt.split("Compute ")[1].split(". Use")[0]
    return prompt.split("Which option equals ")[1].split("?")[0]


def _failed(code: str) -> bool:
    """A broken first attempt of agentrl.data.embedded.broken_print (a NameError or an assignment)."""
    return "prnt(" in code or "\nresult = " in code or code.startswith("result = ")


def _computing(examples):
    """The arith and choice trajectories that use the tool."""
    return [e for e in examples if not e.id.startswith("program") and _calls(e)]


def _lengths(tokenizer, example) -> tuple[int, int, list[int]]:
    """(conversation tokens, response tokens after the prompt, model tokens before each call)."""
    ids, mask = render_with_assistant_mask(tokenizer, example.messages, example.tools)
    prompt = tokenizer.apply_chat_template(
        example.messages[:1], tools=example.tools, tokenize=False, add_generation_prompt=True
    )
    prompt_tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    spans = generated_spans(mask)[: len(_calls(example))]
    before = [tokens_before_marker(ids[start:end], tokenizer) for start, end in spans]
    return len(ids), len(ids) - prompt_tokens, before


def test_plain_data_is_what_the_code_wrote_before_the_modes(by_mode):
    assert _digest(by_mode["plain"]) == PLAIN_DIGEST


def test_every_mode_fails_and_answers_directly_on_the_same_problems(by_mode):
    plain = {e.id: e for e in by_mode["plain"]}
    for mode in ("deliberative", "reactive"):
        assert [e.id for e in by_mode[mode]] == list(plain), mode
        for example in by_mode[mode]:
            reference = plain[example.id]
            if example.id.startswith("program") or not _calls(reference):  # program and direct answers: untouched
                assert example.messages == reference.messages, (mode, example.id)
                continue
            assert _failed(_calls(example)[0]) == _failed(_calls(reference)[0]), (mode, example.id)
            assert example.messages[-1] == reference.messages[-1], "the plain mode's conclusion"
    assert any(_failed(_calls(e)[0]) for e in _computing(by_mode["plain"])), "the sample has failed attempts"
    assert any(not _calls(e) for e in by_mode["plain"] if e.id.startswith("arith")), "and direct answers"


def test_deliberative_plans_then_makes_one_computing_call(by_mode, tokenizer):
    examples = _computing(by_mode["deliberative"])
    assert {e.id.split("-")[0] for e in examples} == {"arith", "choice"}
    for example in examples:
        expression, calls = _expression(example), _calls(example)
        computing = [code for code in calls if not _failed(code)]
        prints = f"print({expression})" if example.id.startswith("arith") else f"== {expression}])"
        assert len(computing) == 1 and computing[0].endswith(prints), (example.id, calls)
        assert len(calls) - 1 == sum(map(_failed, calls)) <= 1, (example.id, calls)
        plan = example.messages[1]["content"]
        assert expression in plan and "one call" in plan, plan
        _, _, before = _lengths(tokenizer, example)
        assert before[0] >= 32 and sum(before) / len(before) >= 32, (example.id, before)


def test_reactive_makes_one_call_per_operation_reading_its_numbers_from_the_tool(by_mode):
    examples = _computing(by_mode["reactive"])
    assert max(len(operation_steps(_expression(e))) for e in examples) >= 3, "the sample has long chains"
    for example in examples:
        expression, calls, outputs = _expression(example), _calls(example), _outputs(example)
        if _failed(calls[0]):
            calls, outputs = calls[1:], outputs[1:]
        assert len(calls) == len(operation_steps(expression)), (example.id, calls)
        literals = {str(n.value) for n in ast.walk(ast.parse(expression)) if isinstance(n, ast.Constant)}
        for index, code in enumerate(calls):
            operation = code.rsplit("== ", 1)[1][:-2] if "options" in code else code[len("print(") : -1]
            tree = ast.parse(operation, mode="eval").body
            assert isinstance(tree, ast.BinOp), (example.id, code)
            read = {embedded.last_line(o) for o in outputs[:index]}
            for operand in (tree.left, tree.right):
                text = ast.get_source_segment(operation, operand)
                assert text in literals | read, f"{example.id}: {text} in {code} is neither in {expression} nor printed"
        answer = example.messages[-1]["content"].split("\\boxed{")[1][:-1]
        if example.id.startswith("arith"):
            assert embedded.last_line(outputs[-1]) == answer == str(eval(expression)), example.id
        else:
            assert embedded.last_line(outputs[-1]) == f"[{answer!r}]", example.id


def test_the_report_classifier_labels_each_mode(by_mode, tokenizer):
    ablations = DEFAULTS.ablations
    assert (ablations.deliberative_max_calls, ablations.deliberative_min_tokens_per_call) == (3, 32)
    for mode, label in (("deliberative", "deliberative"), ("reactive", "reactive"), ("plain", "reactive")):
        for example in _computing(by_mode[mode]):
            _, response, before = _lengths(tokenizer, example)
            record = SampleRecord(
                problem_id=example.id,
                sample_index=0,
                acc=True,
                pred=None,
                tool_calls=len(before),
                tool_errors=tuple(False for _ in before),
                num_turns=len(example.messages) - 1,
                response_tokens=response,
                tokens_before_calls=tuple(before),
            )
            got = reasoning_mode(
                record,
                max_calls=ablations.deliberative_max_calls,
                min_tokens_per_call=ablations.deliberative_min_tokens_per_call,
            )
            assert got == label, (mode, example.id, before)


def test_every_mode_fits_the_sft_length_the_response_budget_and_the_turns(by_mode, tokenizer):
    """With room: a third of sft.max_length and of the response budget stays free in every mode,
    and no trajectory has more assistant turns than rollout.max_turns."""
    sft_length, budget = DEFAULTS.sft.max_length, DEFAULTS.rollout.max_response_tokens
    for mode, examples in by_mode.items():
        for example in examples:
            total, response, _ = _lengths(tokenizer, example)
            assert total <= sft_length * 2 / 3 and response <= budget * 0.9, (mode, example.id, total, response)
            turns = sum(m["role"] == "assistant" for m in example.messages)
            assert turns <= DEFAULTS.rollout.max_turns, (mode, example.id, turns)


def test_operation_steps_follow_python_evaluation_order():
    assert operation_steps("(12+3)*4-5") == [("12", "+", "3"), (0, "*", "4"), (1, "-", "5")]
    assert operation_steps("1+2*3-4*5") == [("2", "*", "3"), ("1", "+", 0), ("4", "*", "5"), (1, "-", 2)]
    with pytest.raises(ValueError, match="2/3"):
        operation_steps("2/3")


@pytest.mark.parametrize("writer", [DeliberativeSolver, ReactiveSolver])
def test_a_tool_that_prints_the_wrong_value_stops_the_writer(writer):
    draft = Draft("arith", "12+3*4", {"expression": "12+3*4"}, "24", 4)
    problem = Problem(
        "arith-sft-00000", "embedded-arith", [{"role": "user", "content": "Compute 12+3*4."}], "math", "24"
    )
    solver = writer(lambda code: "7\n", random.Random(0), failed_attempt_share=0.0)
    with pytest.raises(RuntimeError, match="not the value 24"):
        solver.solve(problem, draft)


def test_stitched_trajectories_in_a_reasoning_mode_are_refused_naming_both_keys():
    with pytest.raises(ConfigError) as refused:
        load_config({"data": {"embedded": {"sft_trajectories": "stitched", "reasoning_mode": "reactive"}}})
    message = str(refused.value)
    assert "data.embedded.reasoning_mode" in message and "data.embedded.sft_trajectories" in message, message
    for mode in WRITERS:
        assert load_config({"data": {"embedded": {"reasoning_mode": mode}}}).data.embedded.reasoning_mode == mode


def test_prepare_data_writes_the_mode_the_config_names(tmp_path):
    small = {"families": ["arith"], "sft_per_family": 3, "rl_pool_per_family": 2, "eval_per_family": 2}
    small |= {"failed_attempt_share": 0.0, "direct_answer_share": 0.0}
    cfg = load_config({"data": {"embedded": {**small, "reasoning_mode": "deliberative"}}, "sandbox": {"workers": 2}})
    prepare(cfg, tmp_path / "sft.parquet", tmp_path / "rl_pool.parquet", tmp_path / "eval")
    for example in read_sft_examples(tmp_path / "sft.parquet"):
        assert example.messages[1]["content"].startswith(f"Compute {_expression(example)}: "), example.messages[1]
