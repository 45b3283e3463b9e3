"""The paper presets behave as upstream's released code (docs/fidelity.md lists each item).

Every expected value below is worked out from upstream's rule (Gen-Verse/Open-AgentRL,
``recipe/demystify/reward.py``, verl's ``math_dapo``, ``tool_agent_loop`` and ``metric_utils``),
not from this project's code; the project's own behaviour is checked beside it as the named option.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.presets import resolved
from helpers.upstream_metrics import verl_style_bootstrap

from agentrl.config import SourceConfig, load_config
from agentrl.data import prompts, upstream
from agentrl.data.records import Problem
from agentrl.rewards import RewardFunction
from agentrl.rewards.registry import UnknownDataSourceError, family_of
from agentrl.sampling.metrics import bootstrap_best_and_maj


@pytest.fixture(scope="module")
def paper():
    return resolved("paper-qwen3-4b.yaml")


@pytest.fixture(scope="module")
def policy():
    """The rollout tests' tiny random Qwen3 (helpers.rollout.random_policy) and its tokenizer."""
    from helpers.rollout import random_policy
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = random_policy()
    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def rl_row(data_source: str, content: str) -> dict:
    truth = '{"inputs": ["1\\n"], "outputs": ["1\\n"]}' if "code" in data_source.lower() else "4"
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"ground_truth": truth},
        "extra_info": {"index": 0},
    }


# --------------------------------------------------------------------------- 1. wrong answers -1.1
def test_item1_paper_preset_scores_wrong_and_codeless_answers_as_released(paper):
    # compute_score: num_turns never passed -> (0 - 2) / 2 * 0.1 = -0.1; min(-0.6, -1 - 0.1) = -1.1
    reward_fn = RewardFunction(paper.reward)
    math = Problem("p1", "math_dapo", [], "math", "70")
    assert reward_fn.score(math, "so \\boxed{71}", response_length=100, num_tool_calls=3).score == pytest.approx(-1.1)
    assert reward_fn.score(math, "so \\boxed{70}", response_length=100, num_tool_calls=3).score == 1.0
    code = Problem("c1", "train-code-taco-easy", [], "code", {"inputs": ["1\n"], "outputs": ["1\n"]})
    no_code = reward_fn.score(code, "I cannot write it.", response_length=100, num_tool_calls=2)
    assert no_code.score == pytest.approx(-1.1)  # code_math gives -1 without a python block
    # a wrong answer inside the overlong buffer: -1.1 plus the DAPO penalty (-0.5 at 18432 tokens)
    late = reward_fn.score(math, "so \\boxed{71}", response_length=18432, num_tool_calls=0)
    assert late.score == pytest.approx(-1.6)
    # the project's option counts the calls the loop ran: min(-0.6, -1 + 0.1 * 3) = -0.7
    counted = load_config({"reward": {"tool_call_shaping": {"enable": True, "call_count": "counted"}}}).reward
    wrong = RewardFunction(counted).score(math, "so \\boxed{71}", response_length=100, num_tool_calls=3)
    assert wrong.score == pytest.approx(-0.7)


# --------------------------------------------------------------------------- functional code without its entry point
def test_a_functional_answer_without_its_entry_point_scores_as_no_code(paper, interpreter):
    # code_math: "fn_name" in the tests and "class Solution" not in the code -> the rewrite looks
    # for a top-level def fn_name; None found -> -1.0 before any test runs; then -1.1 as released.
    reward_fn = RewardFunction(paper.reward, interpreter.sandbox)
    truth = {"inputs": [[1, 2], [3, 4]], "outputs": [3, 7], "fn_name": "add"}
    problem = Problem("f1", "train-code-taco-easy", [], "code", truth)

    def score(code: str) -> float:
        answer = f"```python\n{code}\n```"
        return reward_fn.score(problem, answer, response_length=100, num_tool_calls=1).score

    assert score("def plus(a, b):\n    return a + b") == pytest.approx(-1.1)
    assert score("add = lambda a, b: a + b") == pytest.approx(-1.1), "upstream wraps only a def"
    assert score("def add(a, b):\n    return a + b") == 1.0
    assert score("class Solution:\n    def add(self, a, b):\n        return a + b") == 1.0
    # the text "class Solution" is upstream's test: no rewrite, the run fails every case (0, unshaped)
    assert score("class Solution:\n    pass") == 0.0


# --------------------------------------------------------------------------- 5. LiveCodeBench prompt
def test_item5_livecodebench_prompt_shows_the_whole_test_lists(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    truth = {"ground_truth": {"inputs": ["3\n1 2 3\n", "1\n5\n"], "outputs": ["6\n", "5\n"]}}
    row = {"problem": "Sum them.", "ability": "code", "reward_model": json.dumps(truth), "extra_info": "{}"}
    path = tmp_path / "lcb.parquet"
    pq.write_table(pa.Table.from_pylist([{**row, "data_source": "LiveCodeBench_v6"}]), path)
    (problem,) = upstream.normalize_eval(
        "livecodebench_v6", upstream.read_rows(SourceConfig(str(path), None, None)), "lcb"
    )
    # map_lcb: "...Input:" + str(inputs) + "\nOutput:\n" + str(outputs) + agent_prompt + ...
    expected = "Sum them.\nHere are some input and output examples of the expected code:\nInput:"
    expected += "['3\\n1 2 3\\n', '1\\n5\\n']\nOutput:\n['6\\n', '5\\n']" + prompts.AGENT_PROMPT
    assert expected in problem.prompt[0]["content"]
    assert problem.prompt[0]["content"] == prompts.LCB_INTRO + expected + prompts.LCB_STDIN + prompts.CODE_SUBMIT


# --------------------------------------------------------------------------- 6. RL wrapping per file
def test_item6_rl_wrapping_is_chosen_by_the_files_first_row(paper):
    assert paper.data.upstream.rl_prompt_wrapping == "per_file"
    dapo_first = [rl_row("math_dapo", "Q1"), rl_row("train-code-taco-easy", "Q2"), rl_row("train-math-x", "Q3")]
    per_file = [p.prompt[0]["content"] for p in upstream.normalize_rl(dapo_first, "rl", "per_file")]
    # map_fn2 for the whole file: content + the units sentence, code and other math rows too
    assert per_file == ["Q1" + prompts.UNITS_SENTENCE, "Q2" + prompts.UNITS_SENTENCE, "Q3" + prompts.UNITS_SENTENCE]
    per_row = [p.prompt[0]["content"] for p in upstream.normalize_rl(dapo_first, "rl", "per_row")]
    assert per_row[1] == "Q2" + prompts.AGENT_PROMPT + prompts.CODE_SUBMIT
    assert per_row[2] == prompts.aime_prompt("Q3") + prompts.UNITS_SENTENCE_OTHER_MATH
    # another first row: map_fn_skywork, per row by `"code" in data_source` (case-sensitive)
    other_first = [rl_row("train-math-x", "Q1"), rl_row("Train-CODE-y", "Q2"), rl_row("math_dapo", "Q3")]
    skywork = [p.prompt[0]["content"] for p in upstream.normalize_rl(other_first, "rl", "per_file")]
    assert skywork == [prompts.aime_prompt(q) + prompts.UNITS_SENTENCE_OTHER_MATH for q in ("Q1", "Q2", "Q3")]


# --------------------------------------------------------------------------- 7. maj@k votes
def test_item7_missing_and_empty_boxes_are_one_vote_in_the_upstream_bootstrap():
    correct = [0, 0, 1, 1, 0, 1]
    preds = [None, "", "7", "7", "", None]  # two missing boxes, two empty boxes, two right answers
    upstream_preds = ["" if p is None else p for p in preds]  # compute_score: pred None -> ""
    for k in (2, 4, 6):
        ours = bootstrap_best_and_maj(correct, preds, k, n_boot=300, seed=42)
        assert ours == verl_style_bootstrap(correct, upstream_preds, k, 300, 42), k
    # at k = 6 the merged vote ("" four times) beats "7" far more often than two separate ones would
    merged = bootstrap_best_and_maj(correct, preds, 6, n_boot=300, seed=42)[1]
    separate = verl_style_bootstrap(correct, preds, 6, 300, 42)[1]
    assert merged < separate


# --------------------------------------------------------------------------- 8. unknown data_source
def test_item8_unknown_data_source_fails_when_the_data_is_prepared(tmp_path):
    from agentrl.data.cli import route_sources

    problems = [Problem("a", "math_dapo", [], "math", "1"), Problem("b", "trian-math-typo", [], "math", "2")]
    project = load_config({}).reward
    with pytest.raises(UnknownDataSourceError, match="rl_pool: problem 'b'.*'trian-math-typo'"):
        route_sources({"rl_pool": problems}, project)
    # upstream's compute_score: a source without "code" is strict-box math
    routes = route_sources({"rl_pool": problems}, resolved("paper-qwen3-4b.yaml").reward)
    assert routes == {"math": {"math_dapo": 1, "trian-math-typo": 1}}
    assert family_of("Some-CODE-set", "math") == "code"  # upstream lower-cases before its test


# --------------------------------------------------------------------------- 9. GPQA strict
@pytest.mark.parametrize(
    ("box", "exact", "letter"),
    [("B", True, True), ("(B)", False, True), ("\\text{B}", False, True), ("b", False, True), ("C", False, False)],
)
def test_item9_gpqa_exact_letter_in_the_paper_preset(paper, box, exact, letter):
    # math_dapo strict box: the boxed content must equal the ground truth string exactly
    problem = Problem("g", "gpqa_diamond", [], "science", "B")
    response = f"The answer is \\boxed{{{box}}}"
    strict = RewardFunction(paper.reward).score(problem, response, response_length=10, num_tool_calls=0)
    assert (strict.acc, strict.score) == (exact, 1.0 if exact else pytest.approx(-1.1))
    lenient = load_config({"reward": {"choice_mode": "letter"}}).reward
    assert RewardFunction(lenient).score(problem, response, response_length=10, num_tool_calls=0).acc == letter


def test_item9_exact_mode_reports_the_box_as_pred():
    exact = load_config({"reward": {"choice_mode": "exact"}}).reward
    result = RewardFunction(exact).score(
        Problem("g", "gpqa_diamond", [], "science", "B"), "\\boxed{(B)}", response_length=10, num_tool_calls=0
    )
    assert (result.acc, result.pred, result.details["mode"]) == (False, "(B)", "exact")
    assert np.isclose(result.score, -1.0)


# --------------------------------------------------------------------------- 3. budget inside a tool response
@pytest.mark.parametrize("room_after_call", [3, "exact"])
def test_item3_a_tool_response_over_the_budget_is_not_appended(policy, interpreter, room_after_call):
    from helpers.rollout import GREEDY, arith_problems, call_turn, scripted_loop

    from agentrl.rollout.tool_parser import ToolTurnFormat

    _, tokenizer = policy
    fmt = ToolTurnFormat(tokenizer)
    turn = call_turn(tokenizer, "print(123456789)")
    response = fmt.response_ids("123456789\n")
    # upstream breaks when len(response_mask) + len(tool_response_ids) >= response_length: also
    # when the tool response would fill the budget exactly
    budget = len(turn) + (3 if room_after_call == 3 else len(response))
    problem = arith_problems(1)
    [dropped] = scripted_loop(
        policy, interpreter, [turn, turn], max_response_tokens=budget, tool_response_over_budget="drop"
    ).run(problem, 1, GREEDY, seed=0)
    assert dropped.finish_reason == "length" and dropped.num_turns == 1
    assert dropped.response_ids == [*turn, fmt.end_of_turn_id]  # ends at the call, closed by <|im_end|>
    assert dropped.loss_mask == [1] * len(turn) + [0]
    assert len(dropped.response_ids) == len(turn) + 1  # the length the overlong penalty sees
    [cut] = scripted_loop(policy, interpreter, [turn, turn], max_response_tokens=budget).run(problem, 1, GREEDY, seed=0)
    assert cut.finish_reason == "length" and len(cut.response_ids) == budget  # the project's cut fills it
    assert cut.response_ids[len(turn) :] == response[: budget - len(turn)]


# --------------------------------------------------------------------------- 4. overlong prompts
def _problem(i: int, source: str, words: int) -> Problem:
    return Problem(f"q{i}", source, [{"role": "user", "content": " ".join(["seven"] * words)}], "math", "7")


def test_item4_prompts_over_the_limit_are_dropped_and_counted_per_source(policy):
    from agentrl.data.prompt_fit import fit_problems, prompt_length

    _, tokenizer = policy
    problems = [_problem(0, "math_dapo", 5), _problem(1, "math_dapo", 60), _problem(2, "train-code-a", 30)]
    lengths = [prompt_length(tokenizer, p.prompt, with_tools=False) for p in problems]
    limit = lengths[2]  # upstream keeps doc2len(doc) <= max_prompt_length: the third is kept
    kept, counts = fit_problems(problems, tokenizer, limit, with_tools=False)
    assert [p.id for p in kept] == ["q0", "q2"]
    assert counts["dropped_by_source"] == {"math_dapo": 1} and counts["kept_by_source"] == {
        "math_dapo": 1,
        "train-code-a": 1,
    }
    assert counts["longest_prompt"] == lengths[1]
    # the project's measure adds the tool-schema block the loop renders: the same limit keeps less
    with_tools = [prompt_length(tokenizer, p.prompt, with_tools=True) for p in problems]
    block = with_tools[0] - lengths[0]
    assert block > 50 and all(w - m == block for w, m in zip(with_tools, lengths))
    expected = [p.id for p, length in zip(problems, with_tools) if length <= limit]
    assert [p.id for p in fit_problems(problems, tokenizer, limit, with_tools=True)[0]] == expected
    assert len(expected) < len(kept)


def test_item4_the_loop_measures_prompts_as_the_filter_did(policy, interpreter):
    from helpers.rollout import GREEDY, scripted_loop

    from agentrl.data.prompt_fit import prompt_length

    _, tokenizer = policy
    problem = _problem(0, "math_dapo", 5)
    limit = prompt_length(tokenizer, problem.prompt, with_tools=False)  # the tool block puts it over
    upstream_measure = scripted_loop(policy, interpreter, [], max_prompt_tokens=limit, prompt_length_with_tools=False)
    [trajectory] = upstream_measure.run([problem], 1, GREEDY, seed=0)
    assert len(trajectory.prompt_ids) > limit  # kept as upstream keeps it; the tool block on top
    with pytest.raises(ValueError, match="fit-prompts"):
        scripted_loop(policy, interpreter, [], max_prompt_tokens=limit).run([problem], 1, GREEDY, seed=0)


def test_item4_fit_prompts_cli_writes_the_kept_problems_and_the_counts(tmp_path, policy):
    import json

    from helpers.rollout import random_policy

    from agentrl.__main__ import main
    from agentrl.data.prompt_fit import prompt_length
    from agentrl.data.records import read_problems, write_records

    _, tokenizer = policy
    problems = [_problem(0, "AIME2025", 5), _problem(1, "AIME2025", 80)]
    write_records(problems, tmp_path / "in" / "aime2025.parquet")
    limit = prompt_length(tokenizer, problems[0].prompt, with_tools=True)
    cfg = json.dumps({"eval": {"max_prompt_tokens": limit}})
    argv = ["fit-prompts", "--config-json", cfg, "--model", str(random_policy()), "--limit", "eval"]
    argv += ["--problems", str(tmp_path / "in" / "aime2025.parquet"), "--out-dir", str(tmp_path / "out")]
    assert main([*argv, "--stats", str(tmp_path / "eval.json")]) == 0
    assert [p.id for p in read_problems(tmp_path / "out" / "aime2025.parquet")] == ["q0"]
    stats = json.loads((tmp_path / "eval.json").read_text())["aime2025"]
    assert (stats["limit"], stats["kept"], stats["dropped_by_source"]) == (limit, 1, {"AIME2025": 1})


def test_item4_paper_preset_limits(paper):
    assert (paper.rollout.max_prompt_tokens, paper.eval.max_prompt_tokens) == (2560, 4096)
    assert paper.rollout.prompt_length_with_tools is False
    assert paper.rollout.tool_response_over_budget == "drop"


def test_item9_the_report_says_how_answers_were_graded():
    from agentrl.report.tables import EvalResult, grading_label, summary_frame, summary_markdown
    from agentrl.sampling.metrics import summarize_benchmark

    rows = [
        {"problem_id": f"g{i}", "sample_index": j, "acc": j == 0, "pred": "B", "tool_calls": 0, "tool_errors": []}
        | {"num_turns": 1, "response_tokens": 10, "tokens_before_calls": []}
        for i in range(2)
        for j in range(2)
    ]
    grading = {"math_mode": "strict", "choice_mode": "exact", "unknown_source": "math"}
    metrics = {**summarize_benchmark(rows), "run": {"grading": grading}}
    frame = summary_frame([EvalResult("rl", "gpqa_diamond", metrics)])
    assert "Grading: math strict, choice exact" in summary_markdown(frame, None, [])
    assert grading_label(None) == "unrecorded"  # metrics.json written before the grading was recorded
