"""Evaluation and RL-pool scoring with a real tiny model, agent loop, sandbox and reward registry."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from transformers import AutoTokenizer

from agentrl.config import load_config
from agentrl.data.prompts import CODE_INTERPRETER_TOOL
from agentrl.data.records import Problem, Trajectory, write_records
from agentrl.evaluation import cli as eval_cli
from agentrl.evaluation.cli import metrics_of_samples
from agentrl.evaluation.livecodebench import custom_outputs
from agentrl.filtering import cli as filter_cli
from agentrl.filtering.pass_rates import read_pass_rates
from agentrl.sampling.metrics import summarize_benchmark
from agentrl.sampling.samples import generated_spans, read_jsonl, tokens_before_calls, write_jsonl

CONVERSATION = [
    {"role": "user", "content": "Compute 4821 * 37 - 9156."},
    {
        "role": "assistant",
        "content": "Let me compute it.",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "code_interpreter", "arguments": {"code": "print(4821 * 37 - 9156)"}},
            }
        ],
    },
    {"role": "tool", "content": "169221\n"},
    {"role": "assistant", "content": "The result is 169221.\n\\boxed{169221}"},
]
# Small budgets: the untrained model rambles until the budget, so this bounds the test's time.
CONFIG = {
    "seed": 3,
    "rollout": {"max_response_tokens": 40, "max_turns": 2, "batch_size": 16, "max_prompt_tokens": 512},
    "reward": {"overlong": {"max_response_length": 40, "buffer_length": 8}},
    "sandbox": {"workers": 2},
    "eval": {"n": 3},
    "filter": {"k": 2},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from agentrl.model.build import save_embedded_model, train_tokenizer

    out = tmp_path_factory.mktemp("model") / "sft"
    renderer = train_tokenizer(["0123456789"], 300, "qwen3")
    text = renderer.apply_chat_template(CONVERSATION, tools=[CODE_INTERPRETER_TOOL], tokenize=False)
    save_embedded_model([text] * 20, load_config({}).model.embedded, seed=0, out_dir=out)
    return out


def _problems() -> list[Problem]:
    math = [
        Problem(
            f"arith-{i}",
            "embedded-arith",
            [{"role": "user", "content": f"Compute {i} + 1."}],
            "math",
            str(i + 1),
            {"family": "arith", "level": 1},
        )
        for i in range(2)
    ]
    code = Problem(
        "program-0",
        "embedded-code",
        [{"role": "user", "content": "Print the sum of two numbers."}],
        "code",
        {"inputs": ["1 2\n"], "outputs": ["3\n"]},
        {"family": "program", "level": 1},
    )
    return [*math, code]


def _run_eval(model_dir: Path, problems_path: Path, out: Path) -> dict:
    args = [
        "run",
        "--config-json",
        json.dumps(CONFIG),
        "--model",
        str(model_dir),
        "--problems",
        str(problems_path),
        "--samples",
        str(out / "samples.jsonl"),
        "--metrics",
        str(out / "metrics.json"),
        "--threads",
        "1",
    ]
    assert eval_cli.main(args) == 0
    return json.loads((out / "metrics.json").read_text())


def test_evaluate_writes_samples_and_their_metrics(model_dir, tmp_path):
    problems = _problems()
    write_records(problems, tmp_path / "bench.parquet")
    metrics = _run_eval(model_dir, tmp_path / "bench.parquet", tmp_path / "a")
    rows = list(read_jsonl(tmp_path / "a/samples.jsonl"))
    assert len(rows) == len(problems) * 3
    assert [(r["problem_id"], r["sample_index"]) for r in rows] == [(p.id, i) for p in problems for i in range(3)]
    for row in rows:
        assert row["response_length"] <= 40 and 1 <= row["response_tokens"] <= row["response_length"]
        assert len(row["tokens_before_calls"]) == row["tool_calls"] == len(row["tool_errors"])
        assert row["finish_reason"] in ("stop", "length", "max_turns")
        assert row["score"] <= 1.0 and isinstance(row["text"], str)
    code_rows = [r for r in rows if r["data_source"] == "embedded-code"]
    assert all(r["reward_details"]["family"] == "code" for r in code_rows)
    summary = summarize_benchmark(rows)
    assert {k: metrics[k] for k in summary} == json.loads(json.dumps(summary))
    assert metrics["run"]["n"] == 3 and metrics["run"]["benchmark"] == "bench"
    assert metrics["num_problems"] == 3 and metrics["samples_per_problem"] == 3
    assert sum(metrics["finish_reasons"].values()) == 9
    assert metrics["mean_score"] == pytest.approx(sum(r["score"] for r in rows) / 9)

    health = metrics["tool_health"]
    calls = sum(r["tool_calls"] for r in rows)
    assert health["calls"] == calls and health["infra_excluded"] == 0 and health["problems_left_out"] == 0
    assert all(len(r["tool_outcomes"]) == r["tool_calls"] and not r["infra_failed"] for r in rows)
    assert health["share/ok"] == pytest.approx(sum(not e for r in rows for e in r["tool_errors"]) / max(calls, 1))
    # A problem with a sample the sandbox lost is left out of the summary whole ("@n" needs n).
    rows[4]["infra_failed"] = True
    write_jsonl(rows, tmp_path / "lost.jsonl")
    lost = metrics_of_samples(tmp_path / "lost.jsonl", {})
    kept = [r for r in rows if r["problem_id"] != rows[4]["problem_id"]]
    assert lost["num_problems"] == 2 and lost["tool_health"]["problems_left_out"] == 1
    assert {k: lost[k] for k in summary} == json.loads(json.dumps(summarize_benchmark(kept)))
    assert lost["tool_health"]["infra_excluded"] == 1
    again = _run_eval(model_dir, tmp_path / "bench.parquet", tmp_path / "b")  # same seed and config
    assert (tmp_path / "a/samples.jsonl").read_text() == (tmp_path / "b/samples.jsonl").read_text()
    assert {k: again[k] for k in summary} == {k: metrics[k] for k in summary}


def test_livecodebench_export_of_a_code_benchmark(model_dir, tmp_path):
    code = [p for p in _problems() if p.ability == "code"]
    code.append(
        Problem(
            "program-1",
            "embedded-code",
            [{"role": "user", "content": "Echo the input."}],
            "code",
            {"inputs": ["a\n"], "outputs": ["a\n"]},
            {"question_id": "abc123"},
        )
    )
    write_records(code, tmp_path / "program.parquet")
    _run_eval(model_dir, tmp_path / "program.parquet", tmp_path / "e")
    out = tmp_path / "e/livecodebench_custom_outputs.json"
    args = [
        "export-livecodebench",
        "--problems",
        str(tmp_path / "program.parquet"),
        "--samples",
        str(tmp_path / "e/samples.jsonl"),
        "--out",
        str(out),
    ]
    assert eval_cli.main(args) == 0
    exported = json.loads(out.read_text())
    assert [e["question_id"] for e in exported] == ["program-0", "abc123"]
    rows = list(read_jsonl(tmp_path / "e/samples.jsonl"))
    for entry, problem in zip(exported, code):
        preds = [r["pred"] or "" for r in rows if r["problem_id"] == problem.id]
        assert entry["code_list"] == preds and len(preds) == 3


def test_livecodebench_export_refuses_non_code_and_missing_samples():
    math = _problems()[:1]
    with pytest.raises(ValueError, match=r"data sources \['embedded-arith'\] are not code"):
        custom_outputs(math, [])
    code = _problems()[2:]
    rows = [{"problem_id": "program-0", "sample_index": 0, "pred": "print(3)"}]
    extra = Problem("program-9", "embedded-code", [], "code", {"inputs": [], "outputs": []})
    with pytest.raises(ValueError, match="same number"):
        custom_outputs([*code, extra], rows)


def test_filter_score_writes_pass_rates_and_samples(model_dir, tmp_path):
    problems = _problems()
    write_records(problems, tmp_path / "pool.parquet")
    args = [
        "score",
        "--config-json",
        json.dumps(CONFIG),
        "--model",
        str(model_dir),
        "--pool",
        str(tmp_path / "pool.parquet"),
        "--out",
        str(tmp_path / "pass_rates.parquet"),
        "--samples",
        str(tmp_path / "samples.jsonl"),
        "--threads",
        "1",
    ]
    assert filter_cli.main(args) == 0
    table = read_pass_rates(tmp_path / "pass_rates.parquet")
    rows = list(read_jsonl(tmp_path / "samples.jsonl"))
    assert table["id"].tolist() == [p.id for p in problems] and (table["k"] == 2).all()
    assert len(rows) == 2 * len(problems)
    for problem_id, group in pd.DataFrame(rows).groupby("problem_id"):
        row = table.set_index("id").loc[problem_id]
        assert row["pass_rate"] == group["acc"].mean() and row["correct"] == group["acc"].sum()
        assert row["mean_score"] == pytest.approx(group["score"].mean())
        assert row["mean_response_length"] == pytest.approx(group["response_length"].mean())
    assert table["family"].tolist() == ["arith", "arith", "program"] and table["level"].tolist() == [1, 1, 1]


# --------------------------------------------------------------------------- turn structure
def test_tokens_before_calls_read_from_the_loss_mask(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    thinking = ids("Let me compute it step by step.\n")
    call = ids('<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"}}\n</tool_call>')
    inserted = ids(
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n1\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    malformed = ids("oops </tool_call>")
    answer = ids("The answer is \\boxed{1}<|im_end|>")
    spans = [thinking + call, inserted, malformed, inserted, answer]
    response = [t for span in spans for t in span]
    mask = [1] * len(spans[0]) + [0] * len(inserted) + [1] * len(malformed) + [0] * len(inserted) + [1] * len(answer)
    trajectory = Trajectory(
        "p", 0, [1], response, mask, [0.0] * len(response), "", 3, ["print(1)", "oops "], [False, True], "stop"
    )
    assert generated_spans(mask) == [
        (0, len(spans[0])),
        (len(spans[0]) + len(inserted), len(spans[0]) + len(inserted) + len(malformed)),
        (len(response) - len(answer), len(response)),
    ]
    assert tokenizer.convert_tokens_to_ids("<tool_call>") == call[0]  # one added token
    assert tokens_before_calls(trajectory, tokenizer) == [len(thinking), len(malformed)]
