"""The loaders read files in the upstream schemas (tests/fixtures) into normalized records."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentrl.config import SourceConfig
from agentrl.data import prompts, upstream
from agentrl.data.upstream import DataFormatError

FIXTURES = Path(__file__).parent / "fixtures"


def rows(path: Path | str) -> list[dict]:
    return upstream.read_rows(SourceConfig(id=str(path), file=None, revision=None))


def test_sft_parquet_with_struct_columns_and_string_arguments():
    examples = upstream.normalize_sft(rows(FIXTURES / "sft.parquet"), "sft.parquet")
    assert len(examples) == 2
    first = examples[0].messages
    assert [m["role"] for m in first] == ["system", "user", "assistant", "tool", "assistant"]
    # arguments arrive as a JSON string; normalized to an object; null tool_calls keys are dropped
    assert first[2]["tool_calls"][0]["function"]["arguments"] == {"code": "print(17 * 23)"}
    assert "tool_calls" not in first[1]
    assert examples[0].tools[0]["function"]["name"] == "code_interpreter"


def test_rl_rows_get_the_recipe_prompt_wrapping_and_parsed_code_truth():
    problems = {p.data_source: p for p in upstream.normalize_rl(rows(FIXTURES / "rl.parquet"), "rl.parquet")}
    dapo = problems["math_dapo"].prompt[0]["content"]
    assert dapo == "What is 2 + 2?" + prompts.UNITS_SENTENCE
    other_math = problems["train-math-numinamath"].prompt[0]["content"]
    assert other_math.startswith(prompts.MATH_PROMPT_1) and other_math.endswith(prompts.UNITS_SENTENCE_OTHER_MATH)
    code = problems["train-code-taco-easy"]
    assert code.prompt[0]["content"].endswith(prompts.AGENT_PROMPT + prompts.CODE_SUBMIT)
    assert code.ground_truth == {"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]}
    assert problems["train-code-taco-medium"].ground_truth["fn_name"] == "add"
    assert "test_code" in problems["train-code-leetcode-Easy"].ground_truth
    assert problems["mega-science"].ground_truth == "6"


def test_jsonl_and_parquet_sources_agree():
    from_jsonl = upstream.normalize_rl(rows(FIXTURES / "rl.jsonl"), "rl.jsonl")
    from_parquet = upstream.normalize_rl(rows(FIXTURES / "rl.parquet"), "rl.parquet")
    assert [p.to_row() for p in from_jsonl] == [p.to_row() for p in from_parquet]


@pytest.mark.parametrize(
    ("bench_name", "file", "truth", "data_source"),
    [
        ("aime2024", "aime2024/aime_2024_problems.parquet", "24", "AIME2024"),
        ("aime2025", "aime2025/aime_2025_problems.parquet", "56", "AIME2025"),
        ("gpqa_diamond", "gpqa-diamond/gpqa_diamond.parquet", "B", "gpqa_diamond"),
        (
            "livecodebench_v6",
            "livecodebench-v6/lcb_v6_2502_2505.parquet",
            {"inputs": ["3\n1 2 3\n"], "outputs": ["6\n"]},
            "LiveCodeBench_v6",
        ),
    ],
)
def test_eval_files(bench_name, file, truth, data_source):
    (problem,) = upstream.normalize_eval(bench_name, rows(FIXTURES / "eval" / file), file)
    assert problem.ground_truth == truth
    assert problem.data_source == data_source
    content = problem.prompt[0]["content"]
    if bench_name.startswith("aime"):
        assert content.startswith(prompts.MATH_PROMPT_1) and content.endswith(prompts.ANSWER_FORMAT)
    if bench_name == "gpqa_diamond":
        assert content.startswith("Analyze and solve the following Chemistry problem step by step.")
        assert content.endswith(prompts.GPQA_LETTER)
    if bench_name == "livecodebench_v6":
        assert content.startswith(prompts.LCB_INTRO) and content.endswith(prompts.CODE_SUBMIT)
        assert "Input:['3\\n1 2 3\\n']" in content  # str() of the whole list, as upstream
        assert problem.extra["question_id"] == "abc301_a"  # the official evaluator matches on it


def _write(tmp_path: Path, name: str, table_rows: list[dict]) -> Path:
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(table_rows), path)
    return path


def test_missing_column_names_file_row_and_column(tmp_path):
    good = rows(FIXTURES / "rl.parquet")
    broken = [dict(r) for r in good]
    del broken[2]["reward_model"]
    path = tmp_path / "broken.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in broken))
    with pytest.raises(DataFormatError, match=r"broken.jsonl: row 2, column 'reward_model': missing"):
        upstream.normalize_rl(rows(path), "broken.jsonl")


def test_malformed_code_truth_and_bad_role_are_located(tmp_path):
    good = rows(FIXTURES / "rl.parquet")
    good[3]["reward_model"] = {"ground_truth": "{not json"}
    with pytest.raises(DataFormatError, match=r"row 3, column 'reward_model': not valid JSON"):
        upstream.normalize_rl(good, "rl.parquet")
    sft = rows(FIXTURES / "sft.parquet")
    sft[1]["messages"][1]["role"] = "robot"
    with pytest.raises(DataFormatError, match=r"row 1, column 'messages': messages\[1\]\.role = 'robot'"):
        upstream.normalize_sft(sft, "sft.parquet")


def test_gpqa_solution_must_be_a_letter(tmp_path):
    path = _write(tmp_path, "gpqa.parquet", [{"problem": "q", "solution": "Neon", "domain": "Chemistry"}])
    with pytest.raises(DataFormatError, match=r"gpqa.parquet: row 0, column 'solution'"):
        upstream.normalize_eval("gpqa_diamond", rows(path), "gpqa.parquet")


def test_missing_local_file_is_reported():
    with pytest.raises(DataFormatError, match="does-not-exist.parquet"):
        rows("does-not-exist.parquet")
