"""Verifiers, routing and the reward CLI on tricky real inputs (docs/recipe.md section 4).

One table drives most checks: each row is a data source, a ground truth, a response, the math
mode, and the expected score / acc / pred (``ANY`` where the prediction is not the point). Code
rows run in the real sandbox (``agentrl.tools.sandbox``); shaping is off in this table (it has
its own tests in ``test_reward_shaping.py``).
"""

from __future__ import annotations

import json
import time
from unittest.mock import ANY

import pytest

from agentrl.config import load_config
from agentrl.data.records import Problem
from agentrl.rewards import (
    InvalidGroundTruthError,
    RewardFunction,
    UnknownDataSourceError,
    family_of,
    register_source,
    unregister_source,
)
from agentrl.rewards.cli import main as reward_cli

CASE_TIMEOUT_S = 2.0
NO_SHAPING = {"overlong": {"enable": False}, "tool_call_shaping": {"enable": False, "correct_bonus": False}}
PAD = "The computation above settles it, and I double-checked each step carefully. " * 2  # > 100 chars


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


STDIO_SUM = {"inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]}
SUM_CODE = "a, b = map(int, input().split())\nprint(a + b)"
TWO_SUM_LCB = {"fn_name": "twoSum", "inputs": ["[2,7,11,15]\n9", "[3,2,4]\n6"], "outputs": ["[0, 1]", "[1, 2]"]}
TWO_SUM_CLASS = """\
class Solution:
    def twoSum(self, nums: List[int], target: int) -> List[int]:
        seen = {}
        for i, x in enumerate(nums):
            if target - x in seen:
                return [seen[target - x], i]
            seen[x] = i
"""
LEETCODE_MAX = {
    "entry_point": "Solution().maxValue",
    "import_prefix": "from typing import List\n",
    "test_code": "def check(candidate):\n    assert candidate([1, 5, 3]) == 5\n    assert candidate([-2]) == -2\n",
}

# (id, data_source, ground_truth, response, math_mode, score, acc, pred)
CASES = [
    # ---- math, strict (upstream): last box in the last 100 characters, exact string match
    ("strict-plain", "embedded-arith", "42", "So the answer is \\boxed{42}", "strict", 1.0, True, "42"),
    ("strict-int-ground-truth", "embedded-arith", 42, "\\boxed{42}", "strict", 1.0, True, "42"),
    (
        "strict-nested-braces",
        "AIME2024",
        "\\frac{1}{2}",
        "x = \\boxed{\\frac{1}{2}}",
        "strict",
        1.0,
        True,
        "\\frac{1}{2}",
    ),
    (
        "strict-deep-nesting",
        "math_dapo",
        "\\sqrt{\\frac{a}{b^{2}}}",
        "\\boxed{\\sqrt{\\frac{a}{b^{2}}}}.",
        "strict",
        1.0,
        True,
        ANY,
    ),
    (
        "strict-literal-set-braces",
        "train-math-deepscaler",
        "\\{1,2\\}",
        "\\boxed{\\{1,2\\}}",
        "strict",
        1.0,
        True,
        "\\{1,2\\}",
    ),
    ("strict-several-boxes-last-wins", "math_dapo", "42", "\\boxed{41} no wait \\boxed{42}", "strict", 1.0, True, "42"),
    (
        "strict-several-boxes-last-wrong",
        "math_dapo",
        "42",
        "\\boxed{42} no wait \\boxed{41}",
        "strict",
        -1.0,
        False,
        "41",
    ),
    ("strict-box-outside-tail", "AIME2025", "42", "\\boxed{42}" + PAD, "strict", -1.0, False, None),
    ("strict-box-cut-by-tail", "AIME2025", "42", "\\boxed{42}" + "z" * 95, "strict", -1.0, False, None),
    ("strict-box-just-inside-tail", "AIME2025", "42", "\\boxed{42}" + "z" * 90, "strict", 1.0, True, "42"),
    ("strict-unclosed-last-box", "math_dapo", "42", "\\boxed{42} and finally \\boxed{4", "strict", -1.0, False, None),
    ("strict-no-box", "mega-science", "42", "The answer is 42.", "strict", -1.0, False, None),
    ("strict-equivalent-form-rejected", "AIME2024", "\\frac{1}{2}", "\\boxed{0.5}", "strict", -1.0, False, "0.5"),
    ("strict-spacing-rejected", "AIME2024", "42", "\\boxed{ 42 }", "strict", -1.0, False, " 42 "),
    ("strict-text-wrapper-rejected", "mega-science", "5", "\\boxed{\\text{5}}", "strict", -1.0, False, "\\text{5}"),
    # ---- math, math_verify: equivalence, box anywhere
    ("mv-decimal-vs-fraction", "AIME2024", "\\frac{1}{2}", "\\boxed{0.5}", "math_verify", 1.0, True, "0.5"),
    ("mv-slash-vs-frac", "math_dapo", "1/2", "\\boxed{\\frac12}", "math_verify", 1.0, True, ANY),
    ("mv-dfrac-vs-decimal", "math_dapo", "\\dfrac{3}{4}", "\\boxed{0.75}", "math_verify", 1.0, True, ANY),
    ("mv-text-wrapper", "mega-science", "5", "\\boxed{\\text{5}}", "math_verify", 1.0, True, ANY),
    ("mv-spacing", "AIME2024", "42", "\\boxed{ 42 }", "math_verify", 1.0, True, ANY),
    ("mv-thousands-separator", "math_dapo", "1000", "\\boxed{1,000}", "math_verify", 1.0, True, ANY),
    ("mv-units-dropped", "mega-science", "5", "\\boxed{5\\text{ cm}}", "math_verify", 1.0, True, ANY),
    ("mv-sqrt-forms", "math_dapo", "2\\sqrt{2}", "\\boxed{\\sqrt{8}}", "math_verify", 1.0, True, ANY),
    ("mv-box-outside-tail-ok", "AIME2025", "42", "\\boxed{42}" + PAD, "math_verify", 1.0, True, "42"),
    ("mv-wrong-number", "AIME2025", "42", "\\boxed{43}", "math_verify", -1.0, False, "43"),
    ("mv-rounded-not-equal", "math_dapo", "\\frac{1}{3}", "\\boxed{0.333}", "math_verify", -1.0, False, ANY),
    ("mv-word-anagram-rejected", "mega-science", "Paris", "\\boxed{Pairs}", "math_verify", -1.0, False, "Pairs"),
    ("mv-word-text-and-case", "mega-science", "Paris", "\\boxed{\\text{paris}}", "math_verify", 1.0, True, ANY),
    ("mv-no-box", "math_dapo", "42", "42", "math_verify", -1.0, False, None),
    # ---- multiple choice: the boxed letter, tolerant of wrappers and case
    ("choice-plain", "gpqa_diamond", "B", "\\boxed{B}", "strict", 1.0, True, "B"),
    ("choice-parens", "gpqa_diamond", "B", "\\boxed{(B)}", "strict", 1.0, True, "B"),
    ("choice-text", "gpqa_diamond", "B", "\\boxed{\\text{B}}", "strict", 1.0, True, "B"),
    ("choice-lower", "embedded-choice", "C", "\\boxed{c}", "strict", 1.0, True, "C"),
    ("choice-bold-parens", "gpqa_diamond", "C", "\\boxed{\\textbf{(C)}}", "strict", 1.0, True, "C"),
    ("choice-trailing-dot", "gpqa_diamond", "D", "\\boxed{D.}", "strict", 1.0, True, "D"),
    ("choice-wrong-letter", "gpqa_diamond", "C", "\\boxed{B}", "strict", -1.0, False, "B"),
    ("choice-two-letters", "gpqa_diamond", "B", "\\boxed{B or C}", "strict", -1.0, False, "B or C"),
    ("choice-last-box-wins", "gpqa_diamond", "D", "maybe \\boxed{A}; no, \\boxed{D}", "strict", 1.0, True, "D"),
    ("choice-outside-tail", "gpqa_diamond", "A", "\\boxed{A}" + PAD, "strict", -1.0, False, None),
    # ---- code: stdin/stdout
    ("code-stdio-correct", "LiveCodeBench_v6", STDIO_SUM, fenced(SUM_CODE), "strict", 1.0, True, SUM_CODE + "\n"),
    (
        "code-stdio-extra-newlines",
        "embedded-code",
        STDIO_SUM,
        fenced("a, b = map(int, input().split())\nprint(a + b, end='\\n\\n\\n')"),
        "strict",
        1.0,
        True,
        ANY,
    ),
    (
        "code-stdio-trailing-space",
        "embedded-code",
        STDIO_SUM,
        fenced("a, b = map(int, input().split())\nprint(a + b, end=' \\n')"),
        "strict",
        0.0,
        False,
        ANY,
    ),
    (
        "code-stdio-half-right",
        "train-code-taco-medium",
        STDIO_SUM,
        fenced("a, b = map(int, input().split())\nprint(3)"),
        "strict",
        0.5,
        False,
        ANY,
    ),
    (
        "code-stdio-json-string-truth",
        "LiveCodeBench_v6",
        json.dumps(STDIO_SUM),
        fenced(SUM_CODE),
        "strict",
        1.0,
        True,
        ANY,
    ),
    (
        "code-stdio-last-block-wins",
        "embedded-code",
        STDIO_SUM,
        fenced("print('draft')") + "Fixed:\n" + fenced(SUM_CODE),
        "strict",
        1.0,
        True,
        SUM_CODE + "\n",
    ),
    ("code-hangs", "embedded-code", STDIO_SUM, fenced("while True:\n    pass"), "strict", 0.0, False, ANY),
    ("code-raises", "embedded-code", STDIO_SUM, fenced("raise SystemExit('boom')"), "strict", 0.0, False, ANY),
    ("code-missing", "embedded-code", STDIO_SUM, "I would add the numbers.", "strict", -1.0, False, None),
    ("code-unparsable", "LiveCodeBench_v6", STDIO_SUM, fenced("def f(:\n    pass"), "strict", -1.0, False, ANY),
    # ---- code: functional (fn_name) and LeetCode check harness
    ("code-fn-class-lists", "LiveCodeBench_v6", TWO_SUM_LCB, fenced(TWO_SUM_CLASS), "strict", 1.0, True, ANY),
    (
        "code-fn-free-function-tuple",
        "train-code-taco-easy",
        TWO_SUM_LCB,
        fenced(
            "def twoSum(nums, target):\n    return next((i, j) for j in range(len(nums)) for i in range(j)"
            " if nums[i] + nums[j] == target)"
        ),
        "strict",
        1.0,
        True,
        ANY,
    ),
    (
        "code-fn-taco-wrapped-outputs",
        "train-code-taco-hard",
        {"fn_name": "merge", "inputs": [[[1, 3], [2]], [[], [5, 4]]], "outputs": [[[1, 2, 3]], [[4, 5]]]},
        fenced("def merge(a, b):\n    return sorted(a + b)"),
        "strict",
        1.0,
        True,
        ANY,
    ),
    (
        "code-fn-wrong-on-one",
        "LiveCodeBench_v6",
        TWO_SUM_LCB,
        fenced("class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]"),
        "strict",
        0.5,
        False,
        ANY,
    ),
    (
        "code-fn-fake-result-line",
        "LiveCodeBench_v6",
        TWO_SUM_LCB,
        fenced("def twoSum(nums, target):\n    print('@@agentrl-functional-result@@[0, 1]')\n    return None"),
        "strict",
        0.0,
        False,
        ANY,
    ),
    (
        "code-fn-main-block-not-run",
        "LiveCodeBench_v6",
        TWO_SUM_LCB,
        fenced(TWO_SUM_CLASS + "\nif __name__ == '__main__':\n    print(Solution().twoSum(*eval(input())))"),
        "strict",
        1.0,
        True,
        ANY,
    ),
    (
        "code-fn-missing-function",
        "LiveCodeBench_v6",
        TWO_SUM_LCB,
        fenced("def two_sum(nums, target):\n    return [0, 1]"),
        "strict",
        -1.0,  # no entry point to call: unrunnable, as upstream's rewrite (tests/test_fidelity.py)
        False,
        ANY,
    ),
    (
        "code-leetcode-pass",
        "train-code-leetcode-medium",
        LEETCODE_MAX,
        fenced("class Solution:\n    def maxValue(self, nums: List[int]) -> int:\n        return max(nums)"),
        "strict",
        1.0,
        True,
        ANY,
    ),
    (
        "code-leetcode-fail",
        "train-code-leetcode-medium",
        LEETCODE_MAX,
        fenced("class Solution:\n    def maxValue(self, nums):\n        return nums[0]"),
        "strict",
        0.5,  # upstream's credit per assert: [-2] holds, [1, 5, 3] does not
        False,
        ANY,
    ),
]


def reward_cfg(**reward):
    return load_config({"reward": {**NO_SHAPING, **reward}}).reward


@pytest.fixture(scope="module")
def sandbox():
    from agentrl.tools.factory import make_sandbox

    with make_sandbox(load_config({"sandbox": {"workers": 4}}).sandbox) as box:
        yield box


def test_table_has_enough_cases_across_families():
    families = [family_of(case[1]) for case in CASES]
    assert len(CASES) >= 40, len(CASES)
    assert {"math", "multiple_choice", "code"} == set(families)
    assert len({case[0] for case in CASES}) == len(CASES), "case ids must be unique"


@pytest.mark.parametrize(
    ("case_id", "source", "truth", "response", "mode", "score", "acc", "pred"), CASES, ids=[c[0] for c in CASES]
)
def test_reward_table(case_id, source, truth, response, mode, score, acc, pred, request):
    box = request.getfixturevalue("sandbox") if family_of(source) == "code" else None
    reward_fn = RewardFunction(reward_cfg(math_mode=mode, code_case_timeout_s=CASE_TIMEOUT_S), box)
    result = reward_fn.score(Problem(case_id, source, [], "", truth), response, response_length=0, num_tool_calls=0)
    assert (result.score, result.acc, result.pred) == (pytest.approx(score), acc, pred), result.details
    assert result.details["family"] == family_of(source)
    json.dumps(result.to_json())  # always serializable


def test_code_details_count_cases_and_say_why(sandbox):
    reward_fn = RewardFunction(reward_cfg(code_case_timeout_s=CASE_TIMEOUT_S), sandbox)
    problem = Problem("hang", "embedded-code", [], "code", STDIO_SUM)
    result = reward_fn.score(problem, fenced("import time\ntime.sleep(60)"), response_length=0, num_tool_calls=0)
    assert result.details["cases_passed"] == 0 and result.details["cases_total"] == 2
    assert result.details["case_outcomes"] == ["timeout", "timeout"]
    missing = reward_fn.score(problem, "no code here", response_length=0, num_tool_calls=0)
    assert missing.details["error"] == "no_code" and missing.details["cases_total"] == 2
    broken = reward_fn.score(problem, fenced("x = (1,"), response_length=0, num_tool_calls=0)
    assert broken.details["error"].startswith("syntax_error")


def test_score_many_keeps_order_and_runs_cases_concurrently(sandbox):
    """Eight sleeping cases through a pool of four: about two rounds of sleep, not eight."""
    reward_fn = RewardFunction(reward_cfg(code_case_timeout_s=10.0), sandbox)
    sleepy = "import time\ntime.sleep(1.0)\n" + SUM_CODE
    items = []
    for index in range(4):
        code = sleepy if index % 2 == 0 else sleepy.replace("a + b", "a - b")
        items.append((Problem(f"c{index}", "embedded-code", [], "code", STDIO_SUM), fenced(code), 0, 0))
    items.insert(2, (Problem("m", "embedded-arith", [], "math", "7"), "\\boxed{7}", 0, 0))
    start = time.monotonic()
    results = reward_fn.score_many(items)
    elapsed = time.monotonic() - start
    assert [r.score for r in results] == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert [r.details["family"] for r in results] == ["code", "code", "math", "code", "code"]
    assert elapsed < 6.0, f"8 one-second cases on 4 workers took {elapsed:.1f} s: not concurrent"


def test_code_without_sandbox_is_an_error():
    reward_fn = RewardFunction(reward_cfg())
    problem = Problem("c", "embedded-code", [], "code", STDIO_SUM)
    with pytest.raises(RuntimeError, match="without a sandbox"):
        reward_fn.score(problem, fenced(SUM_CODE), response_length=0, num_tool_calls=0)
    # no code, nothing to run: graded without a sandbox
    assert reward_fn.score(problem, "none", response_length=0, num_tool_calls=0).score == -1.0


# --------------------------------------------------------------------------- routing
@pytest.mark.parametrize(
    ("source", "family"),
    [
        ("LiveCodeBench_v6", "code"),
        ("train-code-taco-medium", "code"),
        ("train-code-leetcode-hard", "code"),
        ("embedded-code", "code"),
        ("gpqa_diamond", "multiple_choice"),
        ("GPQA-Diamond", "multiple_choice"),
        ("embedded-choice", "multiple_choice"),
        ("math_dapo", "math"),
        ("mega-science", "math"),
        ("train-math-deepscaler", "math"),
        ("AIME2024", "math"),
        ("AIME2025", "math"),
        ("aime_2025", "math"),
        ("embedded-arith", "math"),
    ],
)
def test_routing(source, family):
    assert family_of(source) == family


@pytest.mark.parametrize("source", ["openai/gsm8k", "", "math", "embedded-program", "physics-mcq"])
def test_unknown_source_is_an_error_naming_it_and_the_families(source):
    with pytest.raises(UnknownDataSourceError) as info:
        family_of(source)
    message = str(info.value)
    assert repr(source) in message and "multiple_choice" in message and "code" in message


def test_unknown_source_fails_the_reward_rather_than_scoring_zero():
    reward_fn = RewardFunction(reward_cfg())
    with pytest.raises(UnknownDataSourceError, match="openai/gsm8k"):
        reward_fn.score(
            Problem("p", "openai/gsm8k", [], "math", "4"), "\\boxed{4}", response_length=0, num_tool_calls=0
        )


def test_user_registered_source_is_routed_and_can_override():
    register_source("openai/gsm8k", "math")
    register_source("train-code-as-math-*", "math")
    try:
        assert family_of("OpenAI/GSM8K") == "math"
        assert family_of("train-code-as-math-1") == "math"  # tried before the built-in *code* rule
        reward_fn = RewardFunction(reward_cfg())
        result = reward_fn.score(
            Problem("p", "openai/gsm8k", [], "math", "4"), "\\boxed{4}", response_length=0, num_tool_calls=0
        )
        assert result.acc
    finally:
        unregister_source("openai/gsm8k")
        unregister_source("train-code-as-math-*")
    with pytest.raises(UnknownDataSourceError):
        family_of("openai/gsm8k")
    with pytest.raises(UnknownDataSourceError, match="no verifier registered"):
        register_source("x*", "poetry")


# --------------------------------------------------------------------------- bad ground truth
@pytest.mark.parametrize(
    ("source", "truth", "match"),
    [
        ("gpqa_diamond", "42", "single option letter"),
        ("AIME2024", {"inputs": []}, "short answer string"),
        ("embedded-code", {"tests": []}, "inputs, outputs"),
        ("embedded-code", {"inputs": ["1"], "outputs": []}, "same length"),
        ("embedded-code", "not json", "not JSON"),
        ("LiveCodeBench_v6", {"fn_name": "f", "inputs": ["[1"], "outputs": ["1"]}, r"inputs\[0\]"),
        ("LiveCodeBench_v6", {"fn_name": "f(x)", "inputs": ["1"], "outputs": ["1"]}, "identifier"),
    ],
)
def test_malformed_ground_truth_names_the_problem(source, truth, match):
    reward_fn = RewardFunction(reward_cfg())
    with pytest.raises(InvalidGroundTruthError, match=match) as info:
        reward_fn.score(
            Problem("row-17", source, [], "", truth),
            fenced("print(1)") + "\\boxed{A}",
            response_length=0,
            num_tool_calls=0,
        )
    assert "row-17" in str(info.value)


# --------------------------------------------------------------------------- CLI
def test_cli_prints_result_json(tmp_path, capsys):
    response = tmp_path / "response.txt"
    response.write_text("so \\boxed{\\frac{1}{2}}", encoding="utf-8")
    config = json.dumps({"reward": {"math_mode": "math_verify", "tool_call_shaping": {"enable": True}}})
    code = reward_cli(
        [
            "--data-source",
            "AIME2024",
            "--ground-truth",
            "0.5",
            "--response-file",
            str(response),
            "--response-length",
            "10",
            "--num-tool-calls",
            "0",
            "--config-json",
            config,
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["score"], out["acc"], out["pred"]) == (1.0, True, "\\frac{1}{2}")
    assert out["details"]["family"] == "math" and out["details"]["overlong_penalty"] == 0.0

    response.write_text("\\boxed{3}", encoding="utf-8")
    assert (
        reward_cli(
            [
                "--data-source",
                "AIME2024",
                "--ground-truth",
                "0.5",
                "--response-file",
                str(response),
                "--num-tool-calls",
                "2",
                "--config-json",
                config,
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["score"] == pytest.approx(-0.8)


def test_cli_bad_input_exits_2_with_a_message(tmp_path, capsys):
    response = tmp_path / "response.txt"
    response.write_text("\\boxed{4}", encoding="utf-8")
    assert reward_cli(["--data-source", "nope", "--ground-truth", "4", "--response-file", str(response)]) == 2
    assert "'nope'" in capsys.readouterr().err
    assert (
        reward_cli(["--data-source", "AIME2024", "--ground-truth", "4", "--response-file", str(tmp_path / "missing")])
        == 2
    )
    assert "missing" in capsys.readouterr().err
    assert (
        reward_cli(
            [
                "--data-source",
                "AIME2024",
                "--ground-truth",
                "4",
                "--response-file",
                str(response),
                "--config-json",
                '{"reward": {"math_mode": "fuzzy"}}',
            ]
        )
        == 2
    )
    assert "reward.math_mode" in capsys.readouterr().err


def test_cli_grades_code_in_the_sandbox(tmp_path, capsys):
    response = tmp_path / "response.txt"
    response.write_text(fenced(SUM_CODE), encoding="utf-8")
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps(STDIO_SUM), encoding="utf-8")
    assert (
        reward_cli(
            ["--data-source", "LiveCodeBench_v6", "--ground-truth-file", str(truth), "--response-file", str(response)]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert (out["score"], out["acc"], out["details"]["cases_passed"], out["details"]["cases_total"]) == (
        1.0,
        True,
        2,
        2,
    )


def test_math_verify_mode_works_off_the_main_thread():
    """math-verify's signal-based timeout only works in the main thread; off it, it runs unbounded."""
    from concurrent.futures import ThreadPoolExecutor

    reward_fn = RewardFunction(reward_cfg(math_mode="math_verify"))
    problem = Problem("t", "AIME2024", [], "math", "\\frac{1}{2}")
    with ThreadPoolExecutor(max_workers=1) as pool:
        result = pool.submit(reward_fn.score, problem, "\\boxed{0.5}", response_length=0, num_tool_calls=0).result()
    assert result.acc and result.details["matched_by"] == "math_verify"
