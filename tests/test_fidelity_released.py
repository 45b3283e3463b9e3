"""The as-released options (docs/fidelity.md, "As released"): each on a small case whose
expected value is worked out from upstream's rule (Gen-Verse/Open-AgentRL at 149cf8a), beside the
project's value for the same case. ``presets/paper-as-released.yaml`` sets every one of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.presets import AS_RELEASED, PAPER, resolved

from agentrl.config import load_config
from agentrl.data.records import Problem
from agentrl.rewards import InvalidGroundTruthError, RewardFunction

SANDBOX = {"sandbox": {"workers": 2}}


@pytest.fixture(scope="module")
def released():
    return resolved(PAPER, AS_RELEASED, overrides=SANDBOX)


@pytest.fixture(scope="module")
def paper():
    return resolved(PAPER, overrides=SANDBOX)


@pytest.fixture(scope="module")
def sandbox(released):
    from agentrl.tools.factory import make_sandbox

    with make_sandbox(released.sandbox) as box:
        yield box


def _score(cfg, sandbox, truth, answer: str, source: str = "train-code-taco-easy") -> float:
    # a code row's ground truth as the RL file stores it, JSON text (reward.code_ground_truth reads it)
    stored = json.dumps(truth) if isinstance(truth, dict) and "code" in source else truth
    problem = Problem("c1", source, [], "code", stored)
    return RewardFunction(cfg.reward, sandbox).score(problem, answer, response_length=100, num_tool_calls=1).score


# --------------------------------------------------------------------------- code blocks of answers
@pytest.mark.parametrize(
    "fence, project, upstream",
    [
        ("```python\n", 1.0, 1.0),
        ("```py\n", 1.0, -1.1),  # code_math: re.findall(r"```python\n(.*?)```") finds nothing -> -1, shaped
        ("```Python\n", 1.0, -1.1),  # case-sensitive
        ("```python3\n", 1.0, -1.1),  # "```python" then "3\n": no newline right after the tag
    ],
)
def test_answer_code_blocks_as_code_math_extracts_them(paper, released, sandbox, fence, project, upstream):
    truth = {"inputs": ["5\n"], "outputs": ["5\n"]}
    answer = f"Here it is.\n{fence}print(input())\n```"
    assert _score(paper, sandbox, truth, answer) == pytest.approx(project)
    assert _score(released, sandbox, truth, answer) == pytest.approx(upstream)


# --------------------------------------------------------------------------- functional (fn_name) tests
FUNCTIONAL_CASES = [
    # (inputs, outputs, solution, project score, upstream score); fn_name "solve" (not "add": the
    # wrapper's globals hold operator.add, which it would call instead)
    # a list input is spread here; upstream's stdin is str([1, 2]) = "[1, 2]": one line, one argument
    ([[1, 2]], [3], "def solve(a, b):\n    return a + b", 1.0, 0.0),
    ([[1, 2]], [3], "def solve(xs):\n    return sum(xs)", 0.0, 1.0),
    # a string input is one JSON value per line in both; upstream does not skip a trailing blank line
    (["1\n2"], ["3"], "def solve(a, b):\n    return a + b", 1.0, 1.0),
    (["1\n2\n"], ["3"], "def solve(a, b):\n    return a + b", 1.0, 0.0),
    # upstream prints the result (json.dumps for list/bool) and compares with str(expected)
    (["[1, 2]"], [[3]], "def solve(xs):\n    return sum(xs)", 1.0, 0.0),  # "3" != str([3]) = "[3]"
    # JSON's true is no Python literal: check_correctness's ast.literal_eval raises, -1 shaped to -1.1
    (["1\n2"], [True], "def solve(a, b):\n    return a < b", 1.0, -1.1),
    (["1\n2"], ["true"], "def solve(a, b):\n    return a < b", 1.0, 1.0),
    (["[1, 2]"], [[1, 2]], "def solve(xs):\n    return xs", 1.0, 1.0),  # json.dumps([1, 2]) = str([1, 2])
    (['["a"]'], [["a"]], "def solve(xs):\n    return xs", 1.0, 0.0),  # '["a"]' != "['a']"
]


@pytest.mark.parametrize("inputs, outputs, solution, project, upstream", FUNCTIONAL_CASES)
def test_functional_tests_as_the_sandbox_fusion_wrapper_runs_them(
    paper, released, sandbox, inputs, outputs, solution, project, upstream
):
    truth = {"inputs": inputs, "outputs": outputs, "fn_name": "solve"}
    answer = f"```python\n{solution}\n```"
    assert _score(paper, sandbox, truth, answer) == pytest.approx(project)
    assert _score(released, sandbox, truth, answer) == pytest.approx(upstream)


# --------------------------------------------------------------------------- memory of test cases
def test_test_cases_run_at_upstreams_1024_mb_while_the_tool_keeps_2048(paper, released, sandbox):
    from agentrl.tools.code_interpreter import CodeInterpreter

    # 1200 MB of address space: over check_correctness's 1024 MB, within the tool's 2048
    program = "block = bytearray(1200 * 2**20)\nprint(input())"
    truth = {"inputs": ["7\n"], "outputs": ["7\n"]}
    answer = f"```python\n{program}\n```"
    assert released.sandbox.memory_mb == 2048 and released.reward.code_case_memory_mb == 1024
    assert _score(released, sandbox, truth, answer) == 0.0  # MemoryError: the case fails
    assert _score(paper, sandbox, truth, answer) == 1.0  # the paper preset: 2048 for both
    tool = CodeInterpreter(sandbox, released.tool).execute("block = bytearray(1200 * 2**20)\nprint('ok')")
    assert tool.ok and tool.text == "ok\n"


def test_a_case_memory_above_the_local_sandboxs_is_refused_at_load():
    from agentrl.config import check_cross_keys

    cfg = load_config({"sandbox": {"memory_mb": 512}, "reward": {"code_case_memory_mb": 1024}})
    with pytest.raises(Exception, match="reward.code_case_memory_mb"):
        check_cross_keys(cfg)


# --------------------------------------------------------------------------- malformed ground truth
def test_a_malformed_ground_truth_scores_minus_one_then_shaped_as_released(paper, released, sandbox):
    truth = {"inputs": [], "outputs": []}  # no case to grade
    answer = "```python\nprint(1)\n```"
    # compute_score's exception handler: -1.0; then the released shaping: min(-0.6, -1 - 0.1) = -1.1
    assert _score(released, sandbox, truth, answer) == pytest.approx(-1.1)
    with pytest.raises(InvalidGroundTruthError, match="problem 'c1'"):
        _score(paper, sandbox, truth, answer)


# --------------------------------------------------------------------------- tool code blocks
@pytest.mark.parametrize(
    "argument, project, upstream",
    [
        ("```python\nprint(1)\n```", "print(1)", "print(1)"),
        ("```python print(2)```", "```python print(2)```", "print(2)"),  # no newline after the tag: matched upstream
        ("```py\nprint(3)\n```", "print(3)", "```py\nprint(3)\n```"),  # upstream runs the fenced text as is
        ("```python3\nprint(4)\n```", "print(4)", "3\nprint(4)"),  # the "3" stays in the match
        ("```python\n    x = 5\nprint(x)\n```", "    x = 5\nprint(x)", "x = 5\nprint(x)"),  # strip()
    ],
)
def test_tool_code_blocks_as_the_demystify_tool_extracts_them(argument, project, upstream):
    from agentrl.tools.code_interpreter import extract_code

    assert extract_code(argument) == project
    assert extract_code(argument, "upstream") == upstream


# --------------------------------------------------------------------------- malformed tool calls
CALL_CASES = [
    # (text between the tags, upstream: "dropped" | the error text | ("ok", code))
    ("{not json}", "dropped"),  # json.loads fails: HermesToolParser drops it
    ('["code_interpreter"]', "dropped"),  # call["name"] raises TypeError
    ('{"name": "code_interpreter"}', "dropped"),  # no "arguments"
    ('{"arguments": {"code": "1"}}', "dropped"),  # no "name"
    ('{"name": 7, "arguments": {"code": "1"}}', "dropped"),  # FunctionCall.name is a pydantic str
    ('{"name": "browser", "arguments": {"code": "1"}}', "'browser'"),  # self.tools[name]: KeyError
    ('{"name": "code_interpreter", "arguments": {"script": "1"}}', "'code'"),  # parameters["code"]
    ('{"name": "code_interpreter", "arguments": "{\\"code\\": \\"1\\"}"}', "string indices must be integers"),
    ('{"name": "code_interpreter", "arguments": {"code": 12}}', "expected string or bytes-like object"),
    ('{"name": "code_interpreter", "arguments": {"code": "print(1)"}}', ("ok", "print(1)")),
]


@pytest.mark.parametrize("raw, upstream", CALL_CASES)
def test_tool_calls_parse_as_verls_hermes_parser_and_the_demystify_tool(raw, upstream):
    from agentrl.rollout.tool_parser import ERROR_PREFIX, parse_tool_call

    call = parse_tool_call(f"Let me run it.\n<tool_call>\n{raw}\n</tool_call>", "upstream")
    if upstream == "dropped":
        assert call.dropped and not call.ok
    elif isinstance(upstream, tuple):
        assert call.ok and call.code == upstream[1]
    else:
        assert not call.dropped and call.error.startswith(ERROR_PREFIX + upstream), call.error
    lenient = parse_tool_call(f"<tool_call>\n{raw}\n</tool_call>")
    assert not lenient.dropped  # the project answers every malformed call and goes on


def test_a_close_tag_without_an_open_one_ends_the_trajectory_upstream():
    from agentrl.rollout.tool_parser import parse_tool_call

    # HermesToolParser: "<tool_call>" not in the text -> no calls -> the loop breaks
    assert parse_tool_call("print(1)\n</tool_call>", "upstream").dropped
    assert parse_tool_call("print(1)\n</tool_call>").error


@pytest.fixture(scope="module")
def policy():
    from helpers.rollout import random_policy
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = random_policy()
    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def released_interpreter(sandbox, released):
    """The code interpreter with the as-released tool settings (tests/conftest.py's ``interpreter`` has the defaults)."""
    from agentrl.tools.code_interpreter import CodeInterpreter

    return CodeInterpreter(sandbox, released.tool)


def _run_loop(policy, released_interpreter, scripts, **rollout):
    from helpers.rollout import ForceTurns, arith_problems

    from agentrl.rollout import AgentLoop, SamplingParams
    from agentrl.rollout.hf_engine import HFEngine

    model, tokenizer = policy
    cfg = load_config({"rollout": {"max_turns": 4, "max_response_tokens": 400, **rollout}}).rollout
    engine = HFEngine(
        model, pad_token_id=tokenizer.pad_token_id, batch_size=8, logits_processor=ForceTurns(tokenizer, scripts)
    )
    [trajectory] = AgentLoop(engine, tokenizer, released_interpreter, cfg).run(
        arith_problems(1), 1, SamplingParams(temperature=0), seed=0
    )
    return trajectory


def test_a_malformed_call_ends_the_trajectory_as_released(policy, released_interpreter):
    from helpers.rollout import final_turn

    from agentrl.rollout.tool_parser import ToolTurnFormat

    _, tokenizer = policy
    malformed = tokenizer.encode('<tool_call>\n{"name": "code_interpreter", "code": "1"}\n</tool_call>')
    scripts = [malformed, final_turn(tokenizer, "42")]
    ended = _run_loop(policy, released_interpreter, scripts, tool_call_parsing="upstream")
    end_of_turn = ToolTurnFormat(tokenizer).end_of_turn_id
    # upstream: no call parsed -> the loop breaks; the response is the turn (closed here, mask 0)
    assert ended.finish_reason == "stop" and ended.num_turns == 1 and ended.tool_calls == []
    assert ended.response_ids == [*malformed, end_of_turn] and ended.loss_mask == [1] * len(malformed) + [0]
    retried = _run_loop(policy, released_interpreter, scripts)  # the project answers it and the model goes on
    assert retried.num_turns == 2 and retried.tool_errors == [True] and "\\boxed{42}" in retried.text


def test_tool_turns_follow_the_end_of_turn_token_without_a_newline_as_released(policy, released_interpreter):
    from helpers.rollout import call_turn, final_turn

    from agentrl.rollout.tool_parser import ToolTurnFormat

    _, tokenizer = policy
    template, upstream = ToolTurnFormat(tokenizer), ToolTurnFormat(tokenizer, "upstream")
    # verl renders [tool message] alone (apply_chat_template(..., add_generation_prompt=True)) and
    # appends it to the model's "<|im_end|>": no "\n" between the turns
    assert upstream.response_text("42\n") == (
        "<|im_end|><|im_start|>user\n<tool_response>\n42\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert template.response_text("42\n") == upstream.response_text("42\n").replace(
        "<|im_end|><|im_start|>user", "<|im_end|>\n<|im_start|>user"
    )
    assert len(template.response_ids("42\n")) == len(upstream.response_ids("42\n")) + 1
    scripts = [call_turn(tokenizer, "print(6 * 7)"), final_turn(tokenizer, "42")]
    released = _run_loop(policy, released_interpreter, scripts, tool_turn_framing="upstream")
    project = _run_loop(policy, released_interpreter, scripts)
    assert len(project.response_ids) == len(released.response_ids) + 1
    assert "<|im_end|><|im_start|>user" in tokenizer.decode(released.response_ids)


# --------------------------------------------------------------------------- SFT loss
def test_sft_weighs_each_prediction_by_its_input_tokens_mask_as_released(policy):
    import torch
    import torch.nn.functional as F
    from helpers.rollout import sft_conversations

    from agentrl.data.prompts import CODE_INTERPRETER_TOOL
    from agentrl.data.records import SftExample
    from agentrl.sft.batching import tokenize_examples
    from agentrl.sft.trainer import AssistantTokenNll

    model, tokenizer = policy
    [conversation] = sft_conversations(1)
    example = SftExample("s0", conversation, [CODE_INTERPRETER_TOOL])
    [target] = tokenize_examples([example], tokenizer, 4096, "right")
    [upstream] = tokenize_examples([example], tokenizer, 4096, "right", loss_mask_alignment="input")
    assert upstream.input_ids == target.input_ids
    ids, mask = torch.tensor([target.input_ids]), torch.tensor([target.loss_mask])
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    newline = tokenizer.encode("\n", add_special_tokens=False)
    # multiturn_sft_dataset's mask: each assistant message's text as rendered, "...<|im_end|>\n"
    dataset_mask = list(target.loss_mask)
    after_turns = [t + 1 for t in range(len(ids[0]) - 1) if target.loss_mask[t] and ids[0, t] == end_of_turn]
    assert len(after_turns) == 2 and all(ids[0, t].item() in newline for t in after_turns)
    for t in after_turns:
        dataset_mask[t] = 1
    dataset_mask = torch.tensor(dataset_mask)
    # fsdp_sft_trainer: CE(logits[:, :-1], input_ids[:, 1:]) * loss_mask[:, :-1], summed
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
        per_position = F.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none")
        expected = float((per_position * dataset_mask[:-1]).sum())
        nll = AssistantTokenNll(model)
        got, count = nll(ids, torch.ones_like(ids), torch.tensor([upstream.loss_mask]))
        project, _ = nll(ids, torch.ones_like(ids), mask)
    assert float(got) == pytest.approx(expected, rel=1e-5)
    assert int(count) == int(dataset_mask[:-1].sum()) == upstream.trained_targets
    assert abs(float(project) - expected) > 1e-2  # other targets: a different sum
    # the first token of each assistant turn is no target; the newline after its <|im_end|> is, and
    # after the first turn the next turn's <|im_start|> too
    trained = {t for t in range(len(ids[0])) if upstream.loss_mask[t]}
    starts = [t for t in range(1, len(target.loss_mask)) if target.loss_mask[t] and not target.loss_mask[t - 1]]
    assert len(starts) == 2 and not trained & set(starts)
    assert set(after_turns) <= trained
    assert after_turns[0] + 1 in trained and tokenizer.decode([int(ids[0, after_turns[0] + 1])]) == "<|im_start|>"


@pytest.mark.parametrize(
    "targets, step_tokens, micro_batch_mean, micro_batch_sum",
    [
        # one rank, micro-batches of 1 and 3 trained tokens: (NLL_a + NLL_b) / 4 vs (NLL_a / 1 + NLL_b / 3) / 2;
        # upstream's backward on each token mean: NLL_a / 1 + NLL_b / 3 (its "/ n_micro_batches" is after it)
        ([[1, 3]], [[1 / 4, 1 / 4]], [[1 / 2, 1 / 6]], [[1, 1 / 3]]),
        # two ranks, one micro-batch each: upstream's rank losses NLL / n, averaged by the all-reduce (x W here,
        # DeepSpeed averages too)
        ([[1], [3]], [[2 / 4], [2 / 4]], [[2 / 2], [2 / 6]], [[1], [1 / 3]]),
        # two ranks of two micro-batches: the sum is 2x the mean (the paper's 4 micro-batches per rank: 4x)
        ([[2, 2], [4, 4]], [[2 / 12] * 2, [2 / 12] * 2], [[2 / 8] * 2, [2 / 16] * 2], [[1 / 2] * 2, [1 / 4] * 2]),
    ],
)
def test_sft_micro_batch_weighting_as_released(targets, step_tokens, micro_batch_mean, micro_batch_sum):
    from agentrl.sft.trainer import micro_batch_loss_scales

    weightings = {"step_tokens": step_tokens, "micro_batch_mean": micro_batch_mean, "micro_batch_sum": micro_batch_sum}
    for weighting, expected in weightings.items():
        got = micro_batch_loss_scales(targets, weighting)
        assert [len(rank) for rank in got] == [len(rank) for rank in expected]
        assert sum(got, []) == pytest.approx(sum(expected, [])), weighting


# --------------------------------------------------------------------------- GRPO loss weighting
def test_grpo_micro_batch_share_on_two_micro_batches():
    import torch

    from agentrl.grpo import algorithm as alg

    # micro-batch a: one response, 1 loss token of loss 2.0; b: one response, 3 tokens of 0.5
    a = (torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([[1, 0, 0]]))
    b = (torch.tensor([[0.5, 0.5, 0.5]]), torch.tensor([[1, 1, 1]]))
    project = sum(float(alg.aggregate_loss(*m, mode="token-mean", global_token_count=4)) for m in (a, b))
    upstream = sum(float(alg.aggregate_loss(*m, mode="token-mean")) * alg.micro_batch_share(1, 2) for m in (a, b))
    assert project == pytest.approx((2.0 + 1.5) / 4)  # one token mean over the mini-batch
    assert upstream == pytest.approx(0.5 * 2.0 + 0.5 * 0.5)  # dp_actor: sum_b (1/2) masked_mean_b


def _samples(vocab: int):
    import torch

    from agentrl.grpo.batching import PolicySample

    generator = torch.Generator().manual_seed(0)
    samples = []
    for i, (prompt_len, response_len) in enumerate([(6, 9), (4, 3), (7, 14), (5, 6)]):
        ids = torch.randint(5, vocab, (prompt_len + response_len,), generator=generator).tolist()
        mask = (torch.rand(response_len, generator=generator) > 0.3).long().tolist()
        mask[0] = 1
        samples.append(PolicySample(ids, prompt_len, mask, [0.0] * response_len, [1.0, -1.0, 0.7, -0.7][i]))
    return samples


def test_grpo_update_weighs_micro_batches_as_upstreams_dp_actor(monkeypatch):
    """One micro-batch per response (a token budget of 14): the update's gradient is that of
    sum_i (1/4) token-mean_i, each response's policy loss averaged over its own tokens."""
    import torch
    from helpers.rollout import random_policy

    from agentrl.grpo import algorithm as alg
    from agentrl.grpo import step as grpo_step
    from agentrl.grpo.batching import collate
    from agentrl.grpo.policy import ResponseLogProbs
    from agentrl.grpo.step import Components, GrpoStep
    from agentrl.grpo.trainer import GrpoPaths, build_engine
    from agentrl.grpo.variants import resolve_algorithm
    from agentrl.training import deepspeed_engine as dse
    from agentrl.training.model import load_causal_lm

    model_dir, samples = random_policy(), _samples(vocab=300)
    grads = {}
    real_step = grpo_step.step_with_grad_norm

    def recording_step(engine):
        grads.update({k: v.grad.clone() for k, v in engine.module.model.named_parameters() if v.grad is not None})
        return real_step(engine)

    monkeypatch.setattr(grpo_step, "step_with_grad_norm", recording_step)
    grpo = {"n": 2, "batch_prompts": 2, "mini_batch_prompts": 2, "micro_batch_tokens": 14, "lr": 1e-3}
    cfg = load_config({"grpo": {**grpo, "loss_weighting": "micro_batch_share", "deepspeed": {"zero_stage": 0}}})
    ctx = dse.init_distributed()
    unused = Path("-")
    paths = GrpoPaths(model_dir, unused, (), unused, unused, unused, dse.find_deepspeed_config(0))
    actor = ResponseLogProbs(load_causal_lm(model_dir, device=ctx.device), logit_chunk_tokens=7, temperature=1.0)
    engine = build_engine(actor, cfg, paths, ctx, torch.float32, steps=1)
    settings = resolve_algorithm(cfg.grpo)
    step = GrpoStep(Components(cfg, settings, ctx, engine, None, None, None, None, pad_token_id=0))
    plan = step.plan(2, samples)
    assert len(plan) == 1 and len(plan[0].micro_batches) == 4  # one mini-batch, one micro-batch per response
    step.recompute_logprobs(samples, plan)
    step.update(samples, plan)

    reference = load_causal_lm(model_dir, device=torch.device("cpu"))
    reference_actor = ResponseLogProbs(reference, logit_chunk_tokens=10_000, temperature=1.0)
    for sample in samples:
        batch = collate([sample], pad_token_id=0)
        logp, _ = reference_actor(batch)
        loss, _ = alg.policy_loss(
            logp,
            logp.detach(),
            batch.advantages,
            batch.loss_mask,
            clip_low=settings.clip_low,
            clip_high=settings.clip_high,
            clip_c=settings.clip_c,
            ratio_level=settings.ratio_level,
            agg_mode="token-mean",
        )
        (loss * (1 / 4)).backward()  # loss_scale_factor = response_mask.shape[0] / ppo_mini_batch_size
    assert grads
    for name, param in reference.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, atol=1e-7, rtol=1e-4, msg=name)


# --------------------------------------------------------------------------- the blind print wrap
def test_the_blind_print_wrap_breaks_programs_that_end_in_an_indented_line(paper, released, sandbox):
    from agentrl.tools.code_interpreter import CodeInterpreter

    # reward.py wraps the last non-empty line: "    total += i" becomes "print(    total += i)",
    # outside the loop: the loop has no body
    program = "total = 0\nfor i in range(4):\n    total += i"
    as_released = CodeInterpreter(sandbox, released.tool).execute(program)
    assert not as_released.ok and "IndentationError" in as_released.text
    project = CodeInterpreter(sandbox, paper.tool).execute(program)
    assert project.ok and project.text == ""


# --------------------------------------------------------------------------- third reading (issue 53)
def test_a_functional_solution_sees_the_names_the_sandbox_fusion_wrapper_imports(paper, released, sandbox):
    # _process_single_case's wrapper star-imports math, copy, sys, ... before the solution: gcd,
    # sqrt, inf, deepcopy and sys need no import there, under both functional_tests settings
    solution = (
        "def solve(a, b):\n"
        "    g = gcd(a, b)\n"
        "    assert sqrt(16) == 4 and inf > g and deepcopy([g]) == [g] and sys.maxsize > 0\n"
        "    return g"
    )
    truth = {"inputs": ["12\n18"], "outputs": ["6"], "fn_name": "solve"}
    answer = f"```python\n{solution}\n```"
    assert _score(paper, sandbox, truth, answer) == pytest.approx(1.0)
    assert _score(released, sandbox, truth, answer) == pytest.approx(1.0)


REWRITE_CASES = [
    # (fn_name, solution, inputs, outputs, project, upstream)
    # code_math moves the top-level def into class Solution: its recursive call finds no global
    ("fact", "def fact(n):\n    return 1 if n == 0 else n * fact(n - 1)", ["3"], ["6"], 1.0, 0.0),
    # module code calling the function runs before the class exists, and the function is gone
    ("solve", "def solve(a, b):\n    return a + b\nassert solve(1, 2) == 3", ["1\n2"], ["3"], 1.0, 0.0),
    # the method form works either way
    ("solve", "def solve(a, b):\n    return a + b", ["1\n2"], ["3"], 1.0, 1.0),
    # the wrapper calls a global of that name before Solution's method: re.search, operator.add
    ("add", "def add(a, b):\n    return a * b", ["2\n3"], ["6"], 1.0, 0.0),
    (
        "search",
        "class Solution:\n    def search(self, xs, t):\n        return xs.index(t)",
        ["[4, 5]\n5"],
        ["1"],
        1.0,
        0.0,
    ),
]


@pytest.mark.parametrize("fn_name, solution, inputs, outputs, project, upstream", REWRITE_CASES)
def test_a_free_function_becomes_a_method_of_solution_as_code_math_rewrites_it(
    paper, released, sandbox, fn_name, solution, inputs, outputs, project, upstream
):
    truth = {"inputs": inputs, "outputs": outputs, "fn_name": fn_name}
    answer = f"```python\n{solution}\n```"
    assert _score(paper, sandbox, truth, answer) == pytest.approx(project)
    assert _score(released, sandbox, truth, answer) == pytest.approx(upstream)


def test_the_rewrite_is_code_maths_convert_function_to_class_method():
    from agentrl.rewards.code_verifier import as_solution_method

    rewritten = as_solution_method("import math\n\ndef f(x):\n    return x\n\ny = 1", "f")
    assert rewritten == "import math\ny = 1\n\nclass Solution:\n\n    def f(self, x):\n        return x"
    assert "def f(self, x)" in as_solution_method("def f(self, x):\n    return x", "f")  # self kept, not doubled


def test_code_answers_are_read_between_the_first_and_a_second_think_end_as_code_math_splits(paper, released, sandbox):
    truth = {"inputs": ["5\n"], "outputs": ["5\n"]}
    # code_math: completion.split("</think>")[1], then the last ```python block of that part
    answer = "plan</think>```python\nprint(input())\n```</think>```python\nprint(0)\n```"
    assert _score(released, sandbox, truth, answer) == pytest.approx(1.0)
    assert _score(paper, sandbox, truth, answer) == pytest.approx(0.0)  # the whole response's last block


def test_a_count_mismatch_scores_zero_unshaped_as_check_correctness_returns_it(paper, released, sandbox):
    truth = {"inputs": ["1\n", "2\n"], "outputs": ["1\n"]}
    # check_correctness returns [-1, -1] without raising: sum of the True cases / 2 = 0.0, not < 0: no shaping
    assert _score(released, sandbox, truth, "```python\nprint(input())\n```") == 0.0
    assert _score(released, sandbox, truth, "no code") == pytest.approx(-1.1)  # code_math's -1 comes first
    with pytest.raises(InvalidGroundTruthError, match="same length"):
        _score(paper, sandbox, truth, "```python\nprint(input())\n```")


def test_a_case_list_spelled_as_a_string_is_read_with_literal_eval_everywhere(paper, released, sandbox):
    truth = {"inputs": "['5\\n', '6\\n']", "outputs": "['5\\n', '6\\n']"}  # check_correctness: ast.literal_eval
    answer = "```python\nprint(input())\n```"
    assert _score(paper, sandbox, truth, answer) == pytest.approx(1.0)
    assert _score(released, sandbox, truth, answer) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "inputs, outputs, program, project, upstream",
    [
        # a case spelled as its lines: joined here; str() upstream, so stdin is "['5', '6']"
        ([["5", "6"]], [["5", "6"]], "print(input())\nprint(input())", 1.0, 0.0),
        ([["5", "6"]], [["5", "6"]], "print(input())", 0.0, 1.0),  # prints "['5', '6']" = str(["5", "6"])
        ([5], [5], "print(input())", None, 1.0),  # a number: refused here, str(5) upstream
    ],
)
def test_stdio_cases_are_str_of_the_case_as_check_correctness_sends_them(
    paper, released, sandbox, inputs, outputs, program, project, upstream
):
    truth = {"inputs": inputs, "outputs": outputs}
    answer = f"```python\n{program}\n```"
    assert _score(released, sandbox, truth, answer) == pytest.approx(upstream)
    if project is None:
        with pytest.raises(InvalidGroundTruthError, match="must be a string"):
            _score(paper, sandbox, truth, answer)
    else:
        assert _score(paper, sandbox, truth, answer) == pytest.approx(project)


def test_an_epoch_ends_with_the_last_full_batch_as_verls_dataloader_drops_the_rest():
    from agentrl.data.records import Problem as P
    from agentrl.grpo.prompts import PromptSampler

    problems = [P(f"p{i}", "math_dapo", [], "math", "1") for i in range(10)]
    carry, drop = PromptSampler(problems, seed=3), PromptSampler(problems, seed=3)
    epoch0, epoch1 = ([f"p{i}" for i in carry.order(e)] for e in (0, 1))
    carried = [[p.id for p in carry.next_batch(4)] for _ in range(3)]
    dropped = [[p.id for p in drop.next_batch(4, "drop_last")] for _ in range(3)]
    assert carried[2] == epoch0[8:] + epoch1[:2]  # the project's: the batch crosses the epoch's end
    # DataLoader(drop_last=True): 10 // 4 = 2 batches an epoch; the third step starts epoch 1
    assert dropped == [epoch0[:4], epoch0[4:8], epoch1[:4]]
    assert drop.state_dict()["epoch"] == 1 and drop.state_dict()["offset"] == 4


def test_sft_tool_call_arguments_reach_the_template_as_stored(policy):
    from agentrl.data import upstream

    _, tokenizer = policy
    stored = '{"code":"print(1)"}'  # no space after the colon: the file's own spelling
    call = {"type": "function", "function": {"name": "code_interpreter", "arguments": stored}}
    row = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "1\n"},
            {"role": "assistant", "content": "\\boxed{1}"},
        ],
        "tools": [],
    }
    texts = {}
    for setting in ("parsed", "as_stored"):
        [example] = upstream.normalize_sft([row], "sft.parquet", setting)
        texts[setting] = tokenizer.apply_chat_template(example.messages, tokenize=False)
    # multiturn_sft_dataset passes the string on and the template writes it verbatim; parsed, tojson re-spells it
    assert '"arguments": {"code":"print(1)"}}' in texts["as_stored"]
    assert '"arguments": {"code": "print(1)"}}' in texts["parsed"]


def test_an_overlong_prompt_stops_the_stage_as_the_released_dataset_raises(policy):
    from agentrl.data.prompt_fit import fit_problems, prompt_length
    from agentrl.errors import DataFormatError

    _, tokenizer = policy
    problems = [
        Problem(f"q{i}", "math_dapo", [{"role": "user", "content": "seven " * n}], "math", "7")
        for i, n in ((0, 5), (1, 60))
    ]
    limit = prompt_length(tokenizer, problems[0].prompt, with_tools=False)
    kept, counts = fit_problems(problems, tokenizer, limit, False, "drop")
    assert [p.id for p in kept] == ["q0"] and counts["dropped"] == 1
    # CustomRLHFDataset filters nothing; RLHFDataset.__getitem__ with truncation='error' raises
    with pytest.raises(DataFormatError, match="problem 'q1'.*longer than"):
        fit_problems(problems, tokenizer, limit, False, "error")


def test_a_prompt_longer_with_the_tool_block_responds_less_under_upstreams_max_model_len(policy):
    from agentrl.data.prompt_fit import prompt_length
    from agentrl.rollout.context import context_tokens, request_room, tool_schema_tokens

    _, tokenizer = policy
    messages = [{"role": "user", "content": "seven " * 5}]
    limit = prompt_length(tokenizer, messages, with_tools=False)  # kept: at the limit without the schema
    as_fed = prompt_length(tokenizer, messages, with_tools=True)
    rollout = {"max_prompt_tokens": limit, "prompt_length_with_tools": False, "max_response_tokens": 300}
    project = load_config({"rollout": rollout}).rollout
    upstream = load_config({"rollout": {**rollout, "max_model_len": "upstream"}}).rollout
    assert context_tokens(tokenizer, upstream) == limit + 300  # verl: max_prompt_length + max_response_length
    assert request_room(context_tokens(tokenizer, project), as_fed, 0, 300) == 300
    assert request_room(context_tokens(tokenizer, upstream), as_fed, 0, 300) == 300 - (as_fed - limit)
    assert as_fed - limit == tool_schema_tokens(tokenizer) > 0
