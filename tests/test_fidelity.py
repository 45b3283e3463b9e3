"""The paper presets behave as upstream's released code (issue 22; docs/fidelity.md lists each item).

Every expected value below is worked out from upstream's rule (Gen-Verse/Open-AgentRL,
``recipe/demystify/reward.py``, verl's ``math_dapo``, ``tool_agent_loop`` and ``metric_utils``),
not from this project's code; the project's own behaviour is checked beside it as the named option.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_metrics import _verl_style_reference
from test_presets import resolved

from agentrl.config import SourceConfig, load_config
from agentrl.data import prompts, upstream
from agentrl.data.records import Problem
from agentrl.evaluation.metrics import bootstrap_best_and_maj
from agentrl.rewards import RewardFunction
from agentrl.rewards.registry import UnknownDataSourceError, family_of


@pytest.fixture(scope="module")
def paper():
    return resolved("paper-qwen3-4b.yaml")


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


# --------------------------------------------------------------------------- 5. LiveCodeBench prompt
def test_item5_livecodebench_prompt_shows_the_whole_test_lists(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    truth = {"ground_truth": {"inputs": ["3\n1 2 3\n", "1\n5\n"], "outputs": ["6\n", "5\n"]}}
    row = {"problem": "Sum them.", "ability": "code", "reward_model": json.dumps(truth), "extra_info": "{}"}
    path = tmp_path / "lcb.parquet"
    pq.write_table(pa.Table.from_pylist([{**row, "data_source": "LiveCodeBench_v6"}]), path)
    (problem,) = upstream.normalize_eval("livecodebench_v6", upstream.read_rows(SourceConfig(str(path), None)), "lcb")
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
        assert ours == _verl_style_reference(correct, upstream_preds, k, 300, 42), k
    # at k = 6 the merged vote ("" four times) beats "7" far more often than two separate ones would
    merged = bootstrap_best_and_maj(correct, preds, 6, n_boot=300, seed=42)[1]
    separate = _verl_style_reference(correct, preds, 6, 300, 42)[1]
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
