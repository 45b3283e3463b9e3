"""Shard files of scoring and evaluation (agentrl.sampling.shards), with a real tiny model.

Shards gather into byte for byte what one job writes; a shard killed with SIGKILL resumes with
the problems it had written and gathers into the uninterrupted result; a cut last line is
dropped; a shard file of another config is discarded with a log line naming the difference; the
hf engine samples each sequence from its own seed, whatever shares its batch.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers.shard_runs import SHARD_CONFIG, gather_shards, score_shard, shard_problems
from helpers.workflows import ROOT
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.data.records import write_records
from agentrl.evaluation import cli as eval_cli
from agentrl.filtering import cli as filter_cli
from agentrl.rollout import SamplingParams
from agentrl.rollout.hf_engine import HFEngine
from agentrl.sampling.shards import PARTIAL_SUFFIX, shard_range


def test_shard_ranges_cover_the_problems_once():
    for total in (0, 1, 7, 30):
        for shards in (1, 3, 8):
            ranges = [shard_range(total, i, shards) for i in range(shards)]
            assert [i for a, b in ranges for i in range(a, b)] == list(range(total))
    with pytest.raises(ValueError, match="shard 3 is not in 0..2"):
        shard_range(10, 3, 3)


def test_three_shards_gather_into_the_bytes_of_one(random_policy_dir, pool_scored_in_one_job, tmp_path):
    pool, _, one = pool_scored_in_one_job
    files = [tmp_path / f"shards/{i}-of-3.jsonl" for i in range(3)]
    for i, path in enumerate(files):
        score_shard(random_policy_dir, pool, path, i, 3)
    assert gather_shards(pool, files, tmp_path) == one
    assert not list(tmp_path.glob("shards/*" + PARTIAL_SUFFIX)), "finished shards leave no partial file"


def test_the_whole_pool_command_writes_what_the_shards_gather_into(random_policy_dir, pool_scored_in_one_job, tmp_path):
    pool, _, (pass_rates, samples) = pool_scored_in_one_job
    args = ["score", "--config-json", json.dumps(SHARD_CONFIG), "--model", str(random_policy_dir), "--pool", str(pool)]
    args += ["--out", str(tmp_path / "pass_rates.parquet"), "--samples", str(tmp_path / "samples.jsonl")]
    assert filter_cli.main([*args, "--threads", "1"]) == 0
    assert (tmp_path / "pass_rates.parquet").read_bytes() == pass_rates
    assert (tmp_path / "samples.jsonl").read_bytes() == samples


@pytest.mark.slow  # about 15 s on a quiet machine, 45 s under load: a job per problem chunk
def test_a_sigkilled_shard_resumes_with_what_it_wrote(random_policy_dir, pool_scored_in_one_job, tmp_path):
    pool, _, one = pool_scored_in_one_job
    out = tmp_path / "shards/0-of-1.jsonl"
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    command = [sys.executable, "-m", "agentrl", "filter", "score-shard", "--config-json", json.dumps(SHARD_CONFIG)]
    command += ["--model", str(random_policy_dir), "--pool", str(pool), "--shard", "0", "--shards", "1"]
    command += ["--out", str(out), "--threads", "1", "--problems-per-chunk", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    job = subprocess.Popen(command, env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (partial.exists() and len(partial.read_bytes().splitlines()) >= 4):  # header + 3 problems
        assert job.poll() is None, f"the shard job ended before it was killed:\n{job.stderr.read()}"
        assert time.monotonic() < deadline, "no problem was written in 300 s"
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)  # as SLURM preempts: the whole process group, no cleanup
    job.wait()
    written = len(partial.read_bytes().splitlines()) - 1
    assert not out.exists() and 3 <= written < 9, f"killed after {written} problems"
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{written} already finished, {9 - written} to roll out" in again.stderr
    assert gather_shards(pool, [out], tmp_path) == one


def test_a_cut_last_line_is_dropped_and_its_problem_rolled_out_again(
    random_policy_dir, pool_scored_in_one_job, tmp_path, caplog
):
    pool, finished, one = pool_scored_in_one_job
    out = tmp_path / "shards/0-of-1.jsonl"
    out.parent.mkdir()
    lines = finished.read_bytes().splitlines(keepends=True)
    out.with_name(out.name + PARTIAL_SUFFIX).write_bytes(
        b"".join(lines[:5]) + lines[5][:40]
    )  # header, 4 problems, a cut one
    with caplog.at_level(logging.INFO):
        score_shard(random_policy_dir, pool, out, 0, 1)
    assert "dropping the half-written line 6" in caplog.text
    assert "4 already finished, 5 to roll out" in caplog.text
    assert gather_shards(pool, [out], tmp_path) == one


@pytest.mark.parametrize(
    "change, named",
    [({"filter": {"k": 2}}, "n 2 (now 3)"), ({"seed": 6}, "sampling"), ("pool", "problems"), ("model", "model")],
    ids=["k", "seed", "pool", "model"],
)
def test_a_shard_file_of_another_config_is_discarded_with_the_reason(
    random_policy_dir, pool_scored_in_one_job, tmp_path, caplog, change, named
):
    pool, _, one = pool_scored_in_one_job
    foreign_model, foreign_pool, config = random_policy_dir, pool, SHARD_CONFIG
    if change == "pool":
        foreign_pool = tmp_path / "other_pool.parquet"
        write_records(shard_problems(10), foreign_pool)  # the same first nine problems and one more
    elif change == "model":
        foreign_model = tmp_path / "other_model"
        model = AutoModelForCausalLM.from_pretrained(random_policy_dir)
        with torch.no_grad():
            next(model.parameters()).add_(0.01)
        model.save_pretrained(foreign_model)
        AutoTokenizer.from_pretrained(random_policy_dir).save_pretrained(foreign_model)
    else:
        config = json.loads(json.dumps(SHARD_CONFIG))
        for section, values in change.items():
            config[section] = {**config[section], **values} if isinstance(values, dict) else values
    out = tmp_path / "shards/0-of-1.jsonl"
    score_shard(foreign_model, foreign_pool, tmp_path / "foreign/0-of-1.jsonl", 0, 1, config=config)
    out.parent.mkdir()
    (tmp_path / "foreign/0-of-1.jsonl").rename(out.with_name(out.name + PARTIAL_SUFFIX))
    with caplog.at_level(logging.INFO):
        score_shard(random_policy_dir, pool, out, 0, 1)
    assert "written for another config" in caplog.text and named in caplog.text, caplog.text
    assert "0 already finished, 9 to roll out" in caplog.text
    assert gather_shards(pool, [out], tmp_path) == one


def test_another_shard_count_takes_the_finished_problems_over(
    random_policy_dir, pool_scored_in_one_job, tmp_path, caplog
):
    pool, finished, one = pool_scored_in_one_job
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "0-of-1.jsonl").write_bytes(finished.read_bytes())  # left by a run with filter.shards 1
    with caplog.at_level(logging.INFO):
        for i in range(2):
            score_shard(random_policy_dir, pool, folder / f"{i}-of-2.jsonl", i, 2)
    assert caplog.text.count(" already finished, 0 to roll out") == 2, "a shard rolled out a finished problem"
    assert gather_shards(pool, [folder / f"{i}-of-2.jsonl" for i in range(2)], tmp_path) == one


def test_the_gather_refuses_missing_problems_and_mixed_runs(random_policy_dir, pool_scored_in_one_job, tmp_path):
    pool, finished, _ = pool_scored_in_one_job
    lines = finished.read_bytes().splitlines(keepends=True)
    short = tmp_path / "short.jsonl"
    short.write_bytes(b"".join(lines[:-1]))
    with pytest.raises(ValueError, match=r"1 problems are in no shard file.*p0"):
        gather_shards(pool, [short], tmp_path)
    header = json.loads(lines[0])
    header["fingerprint"]["n"] = 2
    other = tmp_path / "other.jsonl"
    other.write_bytes(json.dumps(header).encode() + b"\n" + lines[-1])
    with pytest.raises(ValueError, match="come from different runs: n 2"):
        gather_shards(pool, [short, other], tmp_path)


def test_evaluation_in_two_shards_gives_the_metrics_of_one(random_policy_dir, tmp_path):
    write_records(shard_problems(5), tmp_path / "bench.parquet")
    common = [
        "--config-json",
        json.dumps(SHARD_CONFIG),
        "--model",
        str(random_policy_dir),
        "--problems",
        str(tmp_path / "bench.parquet"),
    ]
    one = ["--samples", str(tmp_path / "one/samples.jsonl"), "--metrics", str(tmp_path / "one/metrics.json")]
    assert eval_cli.main(["run", *common, "--benchmark", "bench", *one, "--threads", "1"]) == 0
    files = [tmp_path / f"two/shards/{i}-of-2.jsonl" for i in range(2)]
    for i, path in enumerate(files):
        shard = ["--shard", str(i), "--shards", "2", "--out", str(path), "--threads", "1"]
        assert eval_cli.main(["shard", *common, "--benchmark", "bench", *shard]) == 0
    two = ["--samples", str(tmp_path / "two/samples.jsonl"), "--metrics", str(tmp_path / "two/metrics.json")]
    assert eval_cli.main(["gather", *common, "--benchmark", "bench", "--shard-files", *map(str, files), *two]) == 0
    assert (tmp_path / "two/metrics.json").read_text() == (tmp_path / "one/metrics.json").read_text()
    assert (tmp_path / "two/samples.jsonl").read_text() == (tmp_path / "one/samples.jsonl").read_text()


def test_one_run_of_two_benchmarks_writes_what_two_runs_write(random_policy_dir, tmp_path):
    """The ablations evaluate every benchmark of a model in one job: each benchmark still draws
    from its own seed, so its files are those of a job of its own."""
    problems = {"bench": shard_problems(3), "other": shard_problems(4)[1:]}
    for name, rows in problems.items():
        write_records(rows, tmp_path / f"{name}.parquet")
    common = ["--config-json", json.dumps(SHARD_CONFIG), "--model", str(random_policy_dir), "--threads", "1"]

    def outputs(folder: str, names: list[str]) -> list[str]:
        return [
            "--samples",
            *(str(tmp_path / folder / name / "samples.jsonl") for name in names),
            "--metrics",
            *(str(tmp_path / folder / name / "metrics.json") for name in names),
        ]

    for name in problems:
        assert (
            eval_cli.main(["run", *common, "--problems", str(tmp_path / f"{name}.parquet"), *outputs("alone", [name])])
            == 0
        )
    both = [str(tmp_path / f"{name}.parquet") for name in problems]
    assert eval_cli.main(["run", *common, "--problems", *both, *outputs("together", list(problems))]) == 0
    for name in problems:
        for file in ("samples.jsonl", "metrics.json"):
            assert (tmp_path / "together" / name / file).read_bytes() == (tmp_path / "alone" / name / file).read_bytes()
    with pytest.raises(SystemExit, match="one path .* per benchmark .*--problems 2, --benchmark 2, --samples 1"):
        eval_cli.main(
            ["run", *common, "--problems", *both, *outputs("short", ["bench"])[:2], *outputs("x", list(problems))[3:]]
        )


def test_each_sequence_samples_from_its_own_seed_whatever_shares_its_batch(random_policy_dir):
    model = AutoModelForCausalLM.from_pretrained(random_policy_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(random_policy_dir)
    prompts = [tokenizer.encode(t) for t in ["Compute 12 + 30.", "Hi", "What is 7 * 8? Use the tool.", "print(1)"]]
    params = SamplingParams(temperature=1.0, max_tokens=16)
    seeds = [11, 22, 33, 44]
    together = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=4).generate(prompts, params, seeds=seeds)
    alone = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=1)
    reordered = alone.generate(prompts[::-1], params, seeds=seeds[::-1])[::-1]
    assert [o.token_ids for o in reordered] == [o.token_ids for o in together]
    assert alone.generate(prompts[1:2], params, seeds=[22])[0].token_ids == together[1].token_ids
    assert alone.generate(prompts[1:2], params, seeds=[23])[0].token_ids != together[1].token_ids
