"""The as-released code grader on rows as the RL file stores them (docs/fidelity.md, "As released",
rows 9 and 16-17; issue 64): each row is written to a JSON-lines file in the released schema, run
through prepare-data (:func:`agentrl.data.cli.prepare`) and read back as the grading stages read
it, then graded by RewardFunction with the real local sandbox. Every expected score is upstream's,
worked out from Gen-Verse/Open-AgentRL at 149cf8a (recipe/demystify/reward.py's compute_score over
verl's code_math.compute_score and sandbox_fusion/utils.py's check_correctness, SandboxFusion's reply
being the program's run), beside the paper preset's score for the same row, or the refusal it
gives the row when the data is prepared.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.presets import AS_RELEASED, PAPER, resolved
from helpers.workflows import ROOT

from agentrl.data.records import KEPT_AS_RELEASED
from agentrl.errors import DataFormatError
from agentrl.rewards import RewardFunction
from agentrl.rewards.ground_truth import read_gradable_problems

# id -> (data_source, reward_model.ground_truth as the file stores it: a JSON text, or not)
RL_ROWS = {
    # -- the refused row kinds: the paper preset refuses each when the data is prepared
    "empty-answer": ("train-math-numinamath", ""),
    "count-mismatch": ("train-code-taco-easy", '{"inputs": ["1\\n", "2\\n"], "outputs": ["1\\n"]}'),
    "no-cases": ("train-code-taco-easy", '{"inputs": [], "outputs": []}'),
    "null-output": ("train-code-taco-easy", '{"inputs": ["5\\n"], "outputs": [null]}'),
    "python-literal": ("train-code-taco-easy", "{'inputs': ['5\\n'], 'outputs': ['5\\n']}"),
    "python-literal-fn": ("train-code-taco-easy", "{'inputs': ['1\\n2'], 'outputs': [True], 'fn_name': 'less'}"),
    "no-tests": ("train-code-taco-easy", "see the problem statement"),
    # -- rows both prepare, graded differently
    "bool-output": ("train-code-taco-medium", '{"inputs": ["1\\n2", "3\\n2"], "outputs": [true, false], "fn_name": "less"}'),
    "fn-name-null": ("train-code-taco-easy", '{"inputs": ["5\\n"], "outputs": ["5\\n"], "fn_name": null}'),
    "fn-name-empty": ("train-code-taco-easy", '{"inputs": ["5\\n"], "outputs": ["5\\n"], "fn_name": ""}'),
    "escaped-slash": ("train-code-taco-easy", '{"inputs": ["a/b\\n"], "outputs": ["a\\/b\\n"]}'),
    "surrogate-echo": ("train-code-taco-easy", '{"inputs": ["\\ud83d\\ude00\\n"], "outputs": ["\\ud83d\\ude00\\n"]}'),
    "surrogate-input": ("train-code-taco-easy", '{"inputs": ["\\ud83d\\ude00\\n"], "outputs": ["1\\n"]}'),
}  # fmt: skip
REFUSED = [
    "empty-answer",
    "count-mismatch",
    "no-cases",
    "null-output",
    "python-literal",
    "python-literal-fn",
    "no-tests",
]
# A GPQA-Diamond row whose answer is no letter among its options
GPQA_ROW = {"problem": "Which is a noble gas?\nA) N\nB) Ne\nC) Na\nD) Ni", "solution": "E", "domain": "Chemistry",
            "data_source": "gpqa_diamond"}  # fmt: skip


def _code(program: str) -> str:
    return f"Here is my solution.\n```python\n{program}\n```"


LESS = "def less(a, b):\n    return a < b"
CLASS_ECHO = "class Solution:\n    pass\n\nprint(input())"
REFUSAL = None  # the paper preset refuses the row when the data is prepared
# (row, response, upstream's score, the paper preset's)
CASES = [
    # an empty answer: math_dapo's strict box compares "" with the box's content
    ("empty-answer", "So the answer is \\boxed{}", 1.0, REFUSAL),
    ("empty-answer", "So the answer is \\boxed{4}", -1.1, REFUSAL),
    # check_correctness returns [-1, -1] for a count mismatch (0.0, not shaped); code_math parses the code first
    ("count-mismatch", _code("print(input())"), 0.0, REFUSAL),
    ("count-mismatch", _code("print(input("), -1.1, REFUSAL),
    ("count-mismatch", "no code at all", -1.1, REFUSAL),
    # no case: code_math divides by len([]) in its try: -1
    ("no-cases", _code("print(input())"), -1.1, REFUSAL),
    # JSON's null is no Python literal: ast.literal_eval raises, -1 for every program
    ("null-output", _code("print(input())"), -1.1, REFUSAL),
    # a Python-literal text: json.loads fails, literal_eval reads it; no "fn_name" in it: graded
    ("python-literal", _code("print(input())"), 1.0, REFUSAL),
    # "fn_name" in the text that is no JSON object: code_math's input_output["fn_name"] raises (-1) ...
    ("python-literal-fn", _code(LESS), -1.1, REFUSAL),
    # ... unless the answer holds class Solution (no rewrite); the wrapper prints True as "true", not str(True)
    ("python-literal-fn", _code("class Solution:\n    def less(self, a, b):\n        return a < b"), 0.0, REFUSAL),
    ("python-literal-fn", _code("class Solution:\n    def less(self, a, b):\n        return str(a < b)"), 1.0, REFUSAL),
    # neither import_prefix nor inputs in the text: code_math's math branch, no box in the answer: -1
    ("no-tests", _code("print(input())"), -1.1, REFUSAL),
    # JSON's true/false: literal_eval raises; a right and a wrong program score alike (zero advantage)
    ("bool-output", _code(LESS), -1.1, 1.0),
    ("bool-output", _code("def less(a, b):\n    return a > b"), -1.1, 0.0),
    # fn_name null: the rewrite finds no function (-1), and with class Solution literal_eval meets the null
    ("fn-name-null", _code("print(input())"), -1.1, 1.0),
    ("fn-name-null", _code(CLASS_ECHO), -1.1, 1.0),
    # fn_name "": the rewrite finds no function unless the answer holds class Solution, then stdin/stdout
    ("fn-name-empty", _code("print(input())"), -1.1, 1.0),
    ("fn-name-empty", _code(CLASS_ECHO), 1.0, 1.0),
    ("fn-name-empty", _code("class Solution:\n    pass\n\nprint(int(input()) + 1)"), 0.0, 0.0),
    # "a\/b" is "a/b" to JSON, a backslash and a slash to literal_eval
    ("escaped-slash", _code("print(input())"), 0.0, 1.0),
    ("escaped-slash", _code('print(input().replace("/", "\\\\/"))'), 1.0, 0.0),
    # a surrogate pair is two code points to literal_eval: no program prints them ...
    ("surrogate-echo", _code("print(input())"), 0.0, 1.0),
    # ... while the stdin, sent to SandboxFusion inside a JSON request, arrives as the one character
    ("surrogate-input", _code("print(len(input()))"), 1.0, 1.0),
]
GPQA_CASES = [("\\boxed{E}", 1.0), ("\\boxed{A}", -1.1)]


def _write_data(folder: Path, rows: list[str], gpqa: dict) -> dict:
    """The RL rows and a GPQA file in the released schemas; the config's data section reading them."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for index, row in enumerate(rows):
        source, truth = RL_ROWS[row]
        lines.append(
            {"data_source": source, "prompt": [{"role": "user", "content": f"Solve problem {row}."}], "ability": "code",
             "reward_model": {"ground_truth": truth, "style": "rule"}, "extra_info": {"index": index, "split": "train"}}
        )  # fmt: skip
    (folder / "rl.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    (folder / "gpqa.jsonl").write_text(json.dumps(gpqa) + "\n", encoding="utf-8")
    fixtures = ROOT / "tests" / "fixtures"
    evals = {
        "aime2024": {"id": str(fixtures / "eval/aime2024/aime_2024_problems.parquet")},
        "aime2025": {"id": str(fixtures / "eval/aime2025/aime_2025_problems.parquet")},
        "gpqa_diamond": {"id": str(folder / "gpqa.jsonl")},
        "livecodebench_v6": {"id": str(fixtures / "eval/livecodebench-v6/lcb_v6_2502_2505.parquet")},
    }
    upstream = {"sft": {"id": str(fixtures / "sft.parquet")}, "rl": {"id": str(folder / "rl.jsonl")}, "eval": evals}
    return {"data": {"source": "upstream", "upstream": upstream}, "sandbox": {"workers": 2}}


def _prepare(cfg, folder: Path) -> dict:
    from agentrl.data.cli import prepare

    return prepare(cfg, folder / "sft.parquet", folder / "rl_pool.parquet", folder / "eval")


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """(config, {row: problem} as GRPO reads the prepared pool, the GPQA problems, prepare's counts)."""
    folder = tmp_path_factory.mktemp("released")
    cfg = resolved(PAPER, AS_RELEASED, overrides=_write_data(folder, list(RL_ROWS), GPQA_ROW))
    counts = _prepare(cfg, folder)
    return cfg, _by_row(folder, list(RL_ROWS)), read_gradable_problems(folder / "eval" / "gpqa_diamond.parquet"), counts


def _by_row(folder: Path, rows: list[str]) -> dict:
    """The prepared pool as GRPO reads it, by fixture row (extra_info.index is the row's place in the file)."""
    problems = {problem.extra["index"]: problem for problem in read_gradable_problems(folder / "rl_pool.parquet")}
    return {row: problems[index] for index, row in enumerate(rows)}


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    """The paper preset's prepared rows of the same file, less the ones it refuses."""
    folder = tmp_path_factory.mktemp("paper")
    kept = [row for row in RL_ROWS if row not in REFUSED]
    gpqa = {**GPQA_ROW, "solution": "B"}
    cfg = resolved(PAPER, overrides=_write_data(folder, kept, gpqa))
    _prepare(cfg, folder)
    return cfg, _by_row(folder, kept)


@pytest.fixture(scope="module")
def sandbox(released):
    from agentrl.tools.factory import make_sandbox

    with make_sandbox(released[0].sandbox) as box:
        yield box


def _score(cfg, sandbox, problem, response: str) -> float:
    reward = RewardFunction(cfg.reward, sandbox).score(problem, response, response_length=100, num_tool_calls=1)
    return reward.score


@pytest.mark.parametrize("row, response, upstream, project", CASES)
def test_code_rows_score_as_the_released_grader_scores_them(released, paper, sandbox, row, response, upstream, project):
    cfg, problems, _, _ = released
    assert _score(cfg, sandbox, problems[row], response) == pytest.approx(upstream)
    paper_cfg, paper_problems = paper
    if project is REFUSAL:
        assert row not in paper_problems
    else:
        assert _score(paper_cfg, sandbox, paper_problems[row], response) == pytest.approx(project)


@pytest.mark.parametrize("response, upstream", GPQA_CASES)
def test_a_gpqa_letter_without_an_option_is_graded_by_the_strict_box_as_released(released, sandbox, response, upstream):
    cfg, _, (problem,), _ = released
    assert problem.ground_truth == "E"
    assert _score(cfg, sandbox, problem, f"The answer is {response}") == pytest.approx(upstream)


def test_the_overlay_keeps_and_counts_the_rows_the_project_refuses(released):
    _, problems, (gpqa,), counts = released
    # the rows the overlay's grader scores as upstream's failure, whatever the answer: marked, counted
    failing = {"empty-answer", "count-mismatch", "no-cases", "null-output", "no-tests", "bool-output", "fn-name-null"}
    marked = {row for row, problem in problems.items() if problem.extra.get(KEPT_AS_RELEASED)}
    assert marked == failing
    assert counts["rl_pool"] == len(RL_ROWS) and counts["kept_as_released/rl_pool"] == len(failing)
    assert "not a Python literal" in problems["bool-output"].extra[KEPT_AS_RELEASED]
    assert "same length" in problems["count-mismatch"].extra[KEPT_AS_RELEASED]
    assert "option letter 'E'" in gpqa.extra[KEPT_AS_RELEASED] and counts["kept_as_released/eval/gpqa_diamond"] == 1
    # the code truth is kept as the file stores it: code_math reads str() of it
    assert problems["bool-output"].ground_truth == RL_ROWS["bool-output"][1]


# row -> (the column prepare-data names, a fragment of its message)
PAPER_REFUSALS = {
    "empty-answer": ("ground_truth", "empty"),
    "count-mismatch": ("ground_truth", "1 outputs"),
    "no-cases": ("ground_truth", "no test cases"),
    "null-output": ("ground_truth", "must be a string"),
    "python-literal": ("reward_model", "not valid JSON"),
    "python-literal-fn": ("reward_model", "not valid JSON"),
    "no-tests": ("reward_model", "not valid JSON"),
}


@pytest.mark.parametrize("row", REFUSED)
def test_the_paper_preset_refuses_each_row_kind_naming_it(tmp_path, row):
    column, fragment = PAPER_REFUSALS[row]
    cfg = resolved(PAPER, overrides=_write_data(tmp_path, ["fn-name-empty", row], GPQA_ROW | {"solution": "B"}))
    with pytest.raises(DataFormatError, match=rf"row 1\b.*column '{column}'.*{fragment}"):
        _prepare(cfg, tmp_path)


def test_the_paper_preset_refuses_a_gpqa_letter_without_an_option(tmp_path):
    cfg = resolved(PAPER, overrides=_write_data(tmp_path, ["fn-name-empty"], GPQA_ROW))
    with pytest.raises(DataFormatError, match=r"gpqa.jsonl: row 0, column 'solution': expected one letter A-D"):
        _prepare(cfg, tmp_path)
