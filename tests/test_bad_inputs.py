"""Bad data, bad paths and inconsistent config: a clear error naming the file, row, column or key,
exit status 2 without a traceback, before any expensive work, and nothing complete-looking left.

One test per class of the bad-input table: missing column, wrong type, bad JSON in row k, a
corrupt parquet / safetensors file, a missing tokenizer, an unwritable output, an empty input, a
cross-key config. The stages run as users run them (``python -m agentrl ...`` subprocesses).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from helpers.stage_inputs import (
    CODE_PROBLEM,
    SFT_EXAMPLE,
    assert_refused,
    fake_model,
    problems_file,
    run_agentrl,
    sft_command,
)

from agentrl.config import ConfigError, check_cross_keys, cross_key_problems, load_config
from agentrl.data.records import read_problems, read_sft_examples, write_records
from agentrl.data.upstream import read_rows
from agentrl.errors import DataFormatError, ModelFolderError
from agentrl.model.folder import check_model_folder
from agentrl.sampling.samples import read_jsonl
from agentrl.training.metrics import read_metrics


# --------------------------------------------------------------------------- missing column, wrong type, bad JSON
def test_missing_column_names_the_file_and_the_column(tmp_path):
    row = CODE_PROBLEM.to_row()
    del row["ground_truth"]
    path = problems_file(tmp_path / "eval.parquet", [row])
    with pytest.raises(DataFormatError, match=r"eval.parquet: column\(s\) \['ground_truth'\] missing"):
        read_problems(path)
    sft_row = SFT_EXAMPLE.to_row()
    del sft_row["messages"]  # was KeyError: 'messages'
    with pytest.raises(DataFormatError, match=r"sft.parquet: column\(s\) \['messages'\] missing"):
        read_sft_examples(problems_file(tmp_path / "sft.parquet", [sft_row]))
    completed = run_agentrl("evaluate", "export-livecodebench", "--problems", path, "--samples", tmp_path / "s.jsonl",
                        "--out", tmp_path / "lcb.json", cwd=tmp_path)  # fmt: skip
    assert_refused(completed, "eval.parquet", "'ground_truth'")
    assert not (tmp_path / "lcb.json").exists()


def test_wrong_type_and_bad_json_name_the_row_and_the_column(tmp_path):
    rows = [CODE_PROBLEM.to_row() for _ in range(4)]
    rows[2] = {**rows[2], "prompt": '[{"role": "user", "content": "hi"}'}  # unterminated: bad JSON in row 2
    with pytest.raises(DataFormatError, match=r"bad.parquet: row 2, column 'prompt': not JSON .*line 1 column 35"):
        read_problems(problems_file(tmp_path / "bad.parquet", rows))
    rows[2] = {**CODE_PROBLEM.to_row(), "extra": "[1, 2]"}
    with pytest.raises(DataFormatError, match=r"row 2, column 'extra': expected dict, got list"):
        read_problems(problems_file(tmp_path / "bad.parquet", rows))
    rows[2] = {**CODE_PROBLEM.to_row(), "prompt": '[{"content": "no role"}]'}
    with pytest.raises(DataFormatError, match=r"row 2, column 'prompt': message 0 is not an object with a 'role'"):
        read_problems(problems_file(tmp_path / "bad.parquet", rows))
    sft_rows = [SFT_EXAMPLE.to_row(), {**SFT_EXAMPLE.to_row(), "tools": "{}"}]
    with pytest.raises(DataFormatError, match=r"row 1, column 'tools': expected list, got dict"):
        read_sft_examples(problems_file(tmp_path / "sft.parquet", sft_rows))


def test_bad_json_lines_name_the_file_the_line_and_the_column(tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"a": 1}\n{"a": 2}\n{"a": 3,, }\n')
    with pytest.raises(DataFormatError, match=r"samples.jsonl: line 3, column 9: not valid JSON"):
        list(read_jsonl(samples))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2\n')
    with pytest.raises(DataFormatError, match=r"metrics.jsonl: line 2, column 11: not JSON"):
        read_metrics(metrics)
    upstream = tmp_path / "rl.jsonl"  # datasets' own error named neither the file nor the row
    upstream.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c" "d"}\n')
    source = load_config({"data": {"upstream": {"rl": {"id": str(upstream)}}}}).data.upstream.rl
    with pytest.raises(DataFormatError, match=r"rl.jsonl: line 3, column 16: not JSON"):
        read_rows(source)


# --------------------------------------------------------------------------- corrupt files, missing tokenizer
def test_corrupt_parquet_and_safetensors_name_the_file(tmp_path):
    broken = tmp_path / "pool.parquet"
    broken.write_bytes(b"PAR1 this is not a parquet file")
    with pytest.raises(DataFormatError, match=r"pool.parquet: not a readable parquet file"):
        read_problems(broken)
    model = fake_model(tmp_path / "model")
    (model / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ModelFolderError, match=r"model.safetensors: not a safetensors file"):
        check_model_folder(model)
    data = tmp_path / "sft.parquet"
    write_records([SFT_EXAMPLE], data)
    completed = run_agentrl(*sft_command(tmp_path, model, data), cwd=tmp_path)
    assert_refused(completed, str(model / "model.safetensors"))
    assert not (tmp_path / "out/sft").exists() and not (tmp_path / "out/metrics.jsonl").exists()


def test_missing_tokenizer_and_missing_model_folder_say_so(tmp_path):
    model = fake_model(tmp_path / "model", tokenizer=False)
    data = tmp_path / "sft.parquet"
    write_records([SFT_EXAMPLE], data)
    completed = run_agentrl(*sft_command(tmp_path, model, data), cwd=tmp_path)
    assert_refused(completed, "no tokenizer (tokenizer.json")  # was "install sentencepiece or tiktoken"
    missing = run_agentrl(*sft_command(tmp_path, tmp_path / "results/models/base", data), cwd=tmp_path)
    assert_refused(missing, "results/models/base does not exist")  # was a bad hub repo id


# --------------------------------------------------------------------------- unwritable output
def test_an_unwritable_output_is_found_before_any_work(tmp_path):
    """--metrics under a regular file: refused at start, before the model, the data or DeepSpeed."""
    (tmp_path / "blocker").write_text("a file where a folder is needed")
    data = tmp_path / "sft.parquet"
    write_records([SFT_EXAMPLE], data)
    completed = run_agentrl(
        *sft_command(tmp_path, fake_model(tmp_path / "model"), data, metrics=tmp_path / "blocker/metrics.jsonl"),
        cwd=tmp_path,
    )
    assert_refused(completed, "--metrics", "blocker/metrics.jsonl", "cannot be written")
    assert not (tmp_path / "out/sft").exists() and not (tmp_path / "ck").exists()
    problems = tmp_path / "eval.parquet"
    write_records([CODE_PROBLEM], problems)
    evaluate = run_agentrl("evaluate", "run", "--model", tmp_path / "model", "--problems", problems,
                       "--samples", tmp_path / "blocker/samples.jsonl", "--metrics", tmp_path / "m.json",
                       cwd=tmp_path)  # fmt: skip
    assert_refused(evaluate, "--samples")
    assert not (tmp_path / "m.json").exists()


# --------------------------------------------------------------------------- empty input
def test_empty_inputs_are_errors(tmp_path):
    empty = problems_file(tmp_path / "empty.parquet", [])
    pd.DataFrame({c: pd.Series(dtype=str) for c in CODE_PROBLEM.to_row()}).to_parquet(empty, index=False)
    with pytest.raises(DataFormatError, match=r"empty.parquet: no rows"):
        read_problems(empty)
    out = tmp_path / "lcb.json"
    samples = tmp_path / "samples.jsonl"
    samples.write_text("")
    completed = run_agentrl("evaluate", "export-livecodebench", "--problems", empty, "--samples", samples,
                        "--out", out, cwd=tmp_path)  # fmt: skip
    assert_refused(completed, "empty.parquet: no rows")  # was exit 0 and an empty output
    assert not out.exists()
    upstream = tmp_path / "rl.jsonl"
    upstream.write_text("\n")
    source = load_config({"data": {"upstream": {"rl": {"id": str(upstream)}}}}).data.upstream.rl
    with pytest.raises(DataFormatError, match=r"rl.jsonl: no rows"):
        read_rows(source)


# --------------------------------------------------------------------------- config
def test_cross_key_config_is_refused_at_load_with_every_key_named():
    cfg = load_config(
        {
            "grpo": {"batch_prompts": 12, "mini_batch_prompts": 8},
            "rollout": {"max_response_tokens": 256},
            "reward": {"overlong": {"enable": True, "max_response_length": 512}},
        }
    )
    problems = cross_key_problems(cfg)
    assert len(problems) == 2, problems
    assert "grpo.batch_prompts (12) must be a multiple of grpo.mini_batch_prompts (8)" in problems[0]
    assert "rollout.max_response_tokens (256)" in problems[1] and "reward.overlong.max_response_length" in problems[1]
    with pytest.raises(ConfigError, match="inconsistent settings"):
        check_cross_keys(cfg)
    check_cross_keys(load_config({}))  # the default recipe is consistent
    # Overlong shaping off everywhere (reward section and the GRPO variant): no budget constraint.
    off = load_config(
        {
            "rollout": {"max_response_tokens": 256},
            "reward": {"overlong": {"enable": False}},
            "grpo": {"algorithm": {"overlong_shaping": False}},
        }
    )
    assert cross_key_problems(off) == []


def test_stage_clis_report_config_errors_without_a_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo:\n  batch_prompts: 12\n  mini_batch_prompts: 8\n")
    grpo = run_agentrl("grpo", "--config", bad, "--model", tmp_path / "m", "--train", tmp_path / "t.parquet",
                   "--out", tmp_path / "o", "--metrics", tmp_path / "x.jsonl", "--checkpoint-dir", tmp_path / "c",
                   cwd=tmp_path)  # fmt: skip
    assert_refused(grpo, "grpo.batch_prompts (12) must be a multiple of grpo.mini_batch_prompts (8)")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("sft:\n  epochz: 3\n")
    sft = run_agentrl("sft", "--config", unknown, "--model", tmp_path / "m", "--data", tmp_path / "d.parquet",
                  "--out", tmp_path / "o", "--metrics", tmp_path / "x.jsonl", "--checkpoint-dir", tmp_path / "c",
                  cwd=tmp_path)  # fmt: skip
    assert_refused(sft, "epochz")  # was a traceback and exit 1


def test_metrics_and_pass_rate_files_name_the_file(tmp_path):
    from agentrl.filtering.pass_rates import read_pass_rates
    from agentrl.report.tables import read_eval_results

    metrics = tmp_path / "eval/sft/aime2024/metrics.json"
    metrics.parent.mkdir(parents=True)
    metrics.write_text('{"samples_per_problem": 4,\n "pass@k": }\n')
    with pytest.raises(DataFormatError, match=r"metrics.json: line 2, column 12: not JSON"):
        read_eval_results([metrics])
    table = tmp_path / "pass_rates.parquet"
    table.write_bytes(b"\0" * 100)
    with pytest.raises(DataFormatError, match=r"pass_rates.parquet: not a readable parquet file"):
        read_pass_rates(table)


# --------------------------------------------------------------------------- the same classes, through the CLIs
def upstream_config(tmp_path: Path, sft: Path, rl: Path) -> Path:
    """A config whose upstream data are local JSON-lines files (no eval sets: nothing from the hub)."""
    config = tmp_path / "upstream.yaml"
    data = {"source": "upstream", "upstream": {"sft": {"id": str(sft)}, "rl": {"id": str(rl)}, "eval": {}}}
    config.write_text(json.dumps({"data": data}))  # JSON is YAML
    return config


def prepare_data(tmp_path: Path, config: Path) -> subprocess.CompletedProcess:
    out = tmp_path / "prepared"
    return run_agentrl("prepare-data", "--config", config, "--sft", out / "sft.parquet", "--rl-pool",
                   out / "rl_pool.parquet", "--eval-dir", out / "eval", cwd=tmp_path)  # fmt: skip


def assert_nothing_written(folder: Path) -> None:
    """No file at all under ``folder`` (check_writable may leave the empty folders it made)."""
    written = [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []
    assert written == [], written


UPSTREAM_SFT_ROW = {
    "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
    "tools": "[]",
}
UPSTREAM_RL_ROW = {
    "prompt": [{"role": "user", "content": "1+1?"}],
    "data_source": "aime2024",
    "reward_model": {"ground_truth": "2"},
}


def grpo_command(tmp_path: Path, model: Path, train: Path, out: Path | None = None) -> list:
    return ["grpo", "--model", model, "--train", train, "--out", out or tmp_path / "out/rl",
            "--metrics", tmp_path / "out/rl_metrics.jsonl", "--checkpoint-dir", tmp_path / "out/rl_ck",
            "--nproc", "0"]  # fmt: skip


def test_cli_wrong_type_in_a_column_names_the_file_row_and_column(tmp_path):
    """GRPO reads its problems before DeepSpeed starts; SFT its conversations."""
    rows = [CODE_PROBLEM.to_row() for _ in range(3)]
    rows[1] = {**rows[1], "extra": "[1, 2]"}  # valid JSON, wrong type: a list where a dict belongs
    train = problems_file(tmp_path / "rl_train.parquet", rows)
    model = fake_model(tmp_path / "model")
    grpo = run_agentrl(*grpo_command(tmp_path, model, train), cwd=tmp_path)
    assert_refused(grpo, "rl_train.parquet: row 1, column 'extra': expected dict, got list")
    assert_nothing_written(tmp_path / "out")
    data = problems_file(
        tmp_path / "sft.parquet", [SFT_EXAMPLE.to_row(), SFT_EXAMPLE.to_row(), {**SFT_EXAMPLE.to_row(), "tools": "{}"}]
    )
    sft = run_agentrl(*sft_command(tmp_path, model, data), cwd=tmp_path)
    assert_refused(sft, "sft.parquet: row 2, column 'tools': expected list, got dict")
    assert_nothing_written(tmp_path / "out")
    assert not (tmp_path / "ck").exists()


def test_cli_bad_json_in_row_k_of_a_jsonl_sft_or_problem_file(tmp_path):
    good_sft, good_rl = json.dumps(UPSTREAM_SFT_ROW), json.dumps(UPSTREAM_RL_ROW)
    sft = tmp_path / "sft.jsonl"
    sft.write_text(f"{good_sft}\n{good_sft}\n{good_sft[:-1]},\n")  # row 2 (line 3): a trailing comma, no brace
    rl = tmp_path / "rl.jsonl"
    rl.write_text(f"{good_rl}\n{good_rl}\n")
    bad_sft = prepare_data(tmp_path, upstream_config(tmp_path, sft, rl))
    # The decoder stops just after the trailing comma, where the next key should start.
    assert_refused(bad_sft, f"sft.jsonl: line 3, column {len(good_sft) + 1}: not JSON")
    assert_nothing_written(tmp_path / "prepared")
    sft.write_text(f"{good_sft}\n")
    rl.write_text(f'{good_rl}\n{{"prompt": [{{"role": "user", "content": "2+2?"}}], "data_source": aime2024}}\n')
    bad_rl = prepare_data(tmp_path, upstream_config(tmp_path, sft, rl))
    assert_refused(bad_rl, "rl.jsonl: line 2, column 66: not JSON")
    assert_nothing_written(tmp_path / "prepared")
    rl.write_text(f"{good_rl}\n")  # the same files, fixed: the stage runs (the test can tell the two apart)
    fixed = prepare_data(tmp_path, upstream_config(tmp_path, sft, rl))
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert (tmp_path / "prepared/rl_pool.parquet").is_file()


def test_cli_corrupt_parquet_names_the_file(tmp_path):
    model = fake_model(tmp_path / "model")
    corrupt = tmp_path / "rl_train.parquet"
    corrupt.write_bytes(b"PAR1" + os.urandom(200) + b"PAR1")
    grpo = run_agentrl(*grpo_command(tmp_path, model, corrupt), cwd=tmp_path)
    assert_refused(grpo, f"{corrupt}: not a readable parquet file")
    sft = run_agentrl(*sft_command(tmp_path, model, corrupt), cwd=tmp_path)
    assert_refused(sft, f"{corrupt}: not a readable parquet file")
    assert_nothing_written(tmp_path / "out")
    assert not (tmp_path / "ck").exists() and not (tmp_path / "out/rl_ck").exists()


def test_cli_unwritable_out_of_grpo_and_filter_scoring_is_found_before_any_work(tmp_path):
    """--out under a regular file: refused before the model folder is even looked at (it does not
    exist here) and before any data is read, with nothing written."""
    (tmp_path / "blocker").write_text("a file where a folder is needed")
    missing_model, missing_data = tmp_path / "no-model", tmp_path / "no-data.parquet"
    grpo = run_agentrl(*grpo_command(tmp_path, missing_model, missing_data, out=tmp_path / "blocker/rl"), cwd=tmp_path)
    assert_refused(grpo, "--out", "blocker/rl", "cannot be written")
    assert "no-model" not in grpo.stderr and "no-data" not in grpo.stderr, grpo.stderr[-2000:]
    assert_nothing_written(tmp_path / "out")
    assert not (tmp_path / "out/rl_ck").exists()
    score = ["filter", "score", "--model", missing_model, "--pool", missing_data]
    bad_out = run_agentrl(*score, "--out", tmp_path / "blocker/pass_rates.parquet", "--samples",
                      tmp_path / "filter/samples.jsonl", cwd=tmp_path)  # fmt: skip
    assert_refused(bad_out, "--out", "blocker/pass_rates.parquet", "cannot be written")
    bad_samples = run_agentrl(*score, "--out", tmp_path / "filter/pass_rates.parquet", "--samples",
                          tmp_path / "blocker/samples.jsonl", cwd=tmp_path)  # fmt: skip
    assert_refused(bad_samples, "--samples", "blocker/samples.jsonl", "cannot be written")
    for completed in (bad_out, bad_samples):
        assert "no-model" not in completed.stderr, completed.stderr[-2000:]
    assert_nothing_written(tmp_path / "filter")


def test_cli_empty_sft_file_is_an_error(tmp_path):
    empty = tmp_path / "sft.parquet"
    pd.DataFrame({c: pd.Series(dtype=str) for c in SFT_EXAMPLE.to_row()}).to_parquet(empty, index=False)
    sft = run_agentrl(*sft_command(tmp_path, fake_model(tmp_path / "model"), empty), cwd=tmp_path)
    assert_refused(sft, "sft.parquet: no rows")
    assert_nothing_written(tmp_path / "out")
    assert not (tmp_path / "ck").exists()
    blank = tmp_path / "sft.jsonl"  # the upstream spelling of an SFT file: JSON lines, here none
    blank.write_text("\n\n")
    rl = tmp_path / "rl.jsonl"
    rl.write_text(json.dumps(UPSTREAM_RL_ROW) + "\n")
    prepared = prepare_data(tmp_path, upstream_config(tmp_path, blank, rl))
    assert_refused(prepared, "sft.jsonl: no rows")
    assert_nothing_written(tmp_path / "prepared")


def test_snakemake_dry_run_refuses_a_response_budget_below_the_overlong_length(tmp_path):
    """Was silent: the overlong penalty could never apply. Now `snakemake -n` names both keys."""
    from helpers.workflows import TINY, run_snakemake, write_config

    budget = {"rollout": {"max_response_tokens": 16}, "reward": {"overlong": {"enable": True}}}
    write_config(tmp_path, TINY, budget)  # TINY's overlong.max_response_length is 32
    refused = run_snakemake(tmp_path, "-n", timeout=180)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output[-3000:]
    assert "rollout.max_response_tokens (16) is below reward.overlong.max_response_length (32)" in output, output[
        -3000:
    ]
    assert "Traceback" not in output, output[-3000:]
    assert not (tmp_path / "results").exists()
    write_config(tmp_path, TINY)  # the same workflow with equal lengths plans its jobs
    planned = run_snakemake(tmp_path, "-n", timeout=180)
    assert planned.returncode == 0, (planned.stdout + planned.stderr)[-3000:]
