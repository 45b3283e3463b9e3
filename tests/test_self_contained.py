"""Self-contained reasoning (``eval.reasoning: self_contained``): no tool schema, no tool turn.

The model card's table has a no-tool half; its rows are produced here by the same evaluate stage
with the tool taken away: the prompt is the plain chat template without the tool block and
without the prompts' tool sentences, generation stops only at the end of the turn, and a
``<tool_call>`` the model writes stays text of its answer. The model is real (the tiny Qwen3 of
tests/helpers/rollout.py through the ``hf`` engine), made to write a tool call by
:class:`ForceTurns`, or trained to write them by itself.
"""

from __future__ import annotations

import json

import pytest
from helpers.rollout import ForceTurns, arith_problems, call_turn, final_turn, random_policy, trained_policy
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.config import load_config
from agentrl.data import prompts
from agentrl.data.records import write_records
from agentrl.evaluation import cli as evaluate_cli
from agentrl.rollout import AgentLoop, SamplingParams
from agentrl.rollout.hf_engine import HFEngine
from agentrl.tools.code_interpreter import CodeInterpreter
from agentrl.tools.factory import make_sandbox

CFG = load_config({"sandbox": {"workers": 1}, "rollout": {"max_turns": 4, "max_response_tokens": 400}})
GREEDY = SamplingParams(temperature=0)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def policy():
    model_dir = random_policy()
    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def _engine(policy, scripts):
    model, tokenizer = policy
    return HFEngine(
        model, pad_token_id=tokenizer.pad_token_id, batch_size=8, logits_processor=ForceTurns(tokenizer, scripts)
    )


def test_every_recipe_prompt_loses_its_tool_sentences_and_keeps_the_rest():
    statement = "Find the number of ordered pairs (a, b) with a + b = 10."
    cases = [
        (prompts.aime_prompt(statement), [prompts.MATH_PROMPT_1, statement, "\\boxed{'The final answer goes here.'}"]),
        (prompts.gpqa_prompt(statement, "Physics"), [statement, prompts.GPQA_LETTER]),
        (prompts.lcb_prompt(statement, ["1 9"], ["1"]), [prompts.LCB_INTRO, statement, prompts.LCB_STDIN]),
        (prompts.rl_prompt(statement, "skywork_code"), [statement, "```python\n# YOUR CODE HERE\n```"]),
        (prompts.rl_prompt(statement, "math_dapo"), [statement, prompts.UNITS_SENTENCE]),
        (prompts.embedded_prompt("arith", "compact", expression="2 + 3"), ["Compute 2 + 3.", "\\boxed{}"]),
        (prompts.embedded_prompt("choice", "compact", expression="2 + 3", options="A) 5\nB) 6"), ["A) 5\nB) 6"]),
        (
            prompts.embedded_prompt("program", "compact", statement="add", example_input="1 2", example_output="3"),
            ["Write a Python program: add", "```python``` block"],
        ),
    ]
    for agentic, kept in cases:
        no_tool = prompts.self_contained_text(agentic)
        assert "tool" not in no_tool.lower(), no_tool
        assert all(part in no_tool for part in kept), (no_tool, kept)
    other = "Solve x + 1 = 2; use any tool you like."  # not the recipe's: left as it is
    assert prompts.self_contained_text(other) == other
    messages = [{"role": "system", "content": "Use the code tool."}, {"role": "user", "content": cases[0][0]}]
    no_tool_user = {"role": "user", "content": prompts.self_contained_text(cases[0][0])}
    assert prompts.self_contained_messages(messages) == [messages[0], no_tool_user], "only user messages change"


def test_the_self_contained_prompt_is_the_plain_chat_template_without_a_tool_schema(policy):
    _, tokenizer = policy
    [problem] = arith_problems(1)
    loop = AgentLoop(_engine(policy, []), tokenizer, None, CFG.rollout, tools=False)
    rendered = tokenizer.decode(loop.prompt_ids(problem))
    assert rendered == tokenizer.apply_chat_template(problem.prompt, add_generation_prompt=True, tokenize=False)
    assert "<tools>" not in rendered and "code_interpreter" not in rendered and "# Tools" not in rendered
    with_tools = AgentLoop(_engine(policy, []), tokenizer, object(), CFG.rollout).prompt_ids(problem)
    assert "code_interpreter" in tokenizer.decode(with_tools), "the agentic prompt declares the tool"
    with pytest.raises(ValueError, match="takes no interpreter"):
        AgentLoop(_engine(policy, []), tokenizer, object(), CFG.rollout, tools=False)


def test_a_tool_call_in_a_self_contained_answer_is_text_and_never_runs(policy):
    _, tokenizer = policy
    answer = call_turn(tokenizer, "print(6 * 7)") + final_turn(tokenizer, "42")
    problems = arith_problems(2)
    loop = AgentLoop(_engine(policy, [answer]), tokenizer, None, CFG.rollout, tools=False)
    trajectories = loop.run(problems, 2, GREEDY, seed=0)
    for trajectory in trajectories:
        assert trajectory.finish_reason == "stop" and trajectory.num_turns == 1
        assert trajectory.tool_calls == [] and trajectory.tool_outcomes == []
        assert trajectory.response_ids == answer, "the whole answer, call included, was generated in one turn"
        assert trajectory.loss_mask == [1] * len(answer), "nothing was inserted: no tool response, no closing token"
        assert '<tool_call>\n{"name": "code_interpreter"' in trajectory.text and "\\boxed{42}" in trajectory.text
        assert "<tool_response>" not in tokenizer.decode(trajectory.response_ids)
    assert loop.stats.tool_calls == 0 and loop.stats.inserted_tokens == 0
    # The same answer with the tool: the loop stops at </tool_call>, runs the call, answers it.
    with make_sandbox(CFG.sandbox) as sandbox:
        loop = AgentLoop(
            _engine(policy, [call_turn(tokenizer, "print(6 * 7)"), final_turn(tokenizer, "42")]),
            tokenizer,
            CodeInterpreter(sandbox, CFG.tool),
            CFG.rollout,
        )
        [agentic] = loop.run(problems[:1], 1, GREEDY, seed=0)
    assert agentic.tool_calls == ["print(6 * 7)"] and agentic.num_turns == 2
    assert "<tool_response>\n42\n" in tokenizer.decode(agentic.response_ids)


def test_evaluate_self_contained_runs_no_tool_and_records_its_half(tmp_path):
    model_dir = trained_policy()
    problems = arith_problems(4, seed=5)
    write_records(problems, tmp_path / "arith.parquet")
    cfg = {
        "sandbox": {"workers": 1},
        "rollout": {"engine": "hf", "max_turns": 4, "max_response_tokens": 96},
        "reward": {"overlong": {"enable": False}},  # a 96-token budget holds no 128-token buffer
        "eval": {"n": 3, "temperature": 1.0, "top_p": 1.0},
    }
    out = {}
    for reasoning in ("agentic", "self_contained"):
        out[reasoning] = tmp_path / reasoning
        args = ["run", "--config-json", json.dumps(cfg), "--model", str(model_dir)]
        args += ["--problems", str(tmp_path / "arith.parquet"), "--benchmark", "arith", "--reasoning", reasoning]
        args += ["--samples", str(out[reasoning] / "samples.jsonl"), "--metrics", str(out[reasoning] / "metrics.json")]
        assert evaluate_cli.main(args) == 0
    agentic, no_tool = (
        [json.loads(line) for line in (out[r] / "samples.jsonl").read_text().splitlines()]
        for r in ("agentic", "self_contained")
    )
    assert sum(row["tool_calls"] for row in agentic) > 0, "the trained model calls the tool when it has one"
    assert all(row["tool_calls"] == 0 and row["num_turns"] == 1 for row in no_tool)
    assert not any("<tool_response>" in row["text"] for row in no_tool)
    metrics = json.loads((out["self_contained"] / "metrics.json").read_text())
    assert metrics["run"]["reasoning"] == "self_contained" and metrics["tool_health"]["calls"] == 0
    assert json.loads((out["agentic"] / "metrics.json").read_text())["run"]["reasoning"] == "agentic"


@pytest.mark.parametrize(
    ("name", "fixture"),
    [
        ("aime2024", "eval/aime2024/aime_2024_problems.parquet"),
        ("aime2025", "eval/aime2025/aime_2025_problems.parquet"),
        ("gpqa_diamond", "eval/gpqa-diamond/gpqa_diamond.parquet"),
        ("livecodebench_v6", "eval/livecodebench-v6/lcb_v6_2502_2505.parquet"),
    ],
)
def test_the_paper_eval_sets_lose_every_tool_sentence(name, fixture):
    from pathlib import Path

    from agentrl.config import SourceConfig
    from agentrl.data import upstream

    path = Path(__file__).parent / "fixtures" / fixture
    rows = upstream.read_rows(SourceConfig(id=str(path), file=None, revision=None))
    problems = upstream.normalize_eval(name, rows, str(path))
    for problem in problems:
        [message] = problem.prompt
        assert "tool" in message["content"]  # the agentic prompt, as upstream's eval scripts send it
        assert "tool" not in prompts.self_contained_text(message["content"]).lower(), problem.id
