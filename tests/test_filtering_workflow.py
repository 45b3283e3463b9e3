"""The filter rules in Snakemake: a changed threshold or target re-runs the selection, never the scoring.

A small Snakefile in a temporary folder includes the repository's ``rules/common.smk`` and
``rules/filter.smk`` (the rules under test, unchanged) with the repository's config and schema.
Snakemake really runs both rules once (a tiny untrained model scores the pool), so its metadata
holds each job's params, as after a real run; dry runs with config overrides then show what each
change would re-run. Slow: every Snakemake call pays its start-up (about 5 s here).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from helpers.workflows import job_counts, merged, rules_snakefile, snakemake

from agentrl.data.records import Problem, write_records
from agentrl.filtering.pass_rates import pass_rate_table, write_pass_rates

pytestmark = pytest.mark.slow

K = 8
# Scoring budgets that keep the real scoring run short (an untrained model rambles to the budget).
TINY = {
    "filter": {"k": 2},
    "rollout": {"max_response_tokens": 24, "max_turns": 1},
    "reward": {"overlong": {"max_response_length": 24, "buffer_length": 8}},
    "sandbox": {"workers": 1, "preload_modules": []},
}
WRAPPER = rules_snakefile("filter.smk")


def _snakemake(workdir: Path, *args: str) -> str:
    done = snakemake(workdir, *args, timeout=300, snakefile=workdir / "Snakefile", cores=1)
    return done.stdout + done.stderr


def _override(workdir: Path, name: str, values: dict) -> str:
    """A config file with the tiny scoring budgets and ``values`` on top (deep-merged)."""
    path = workdir / name
    path.write_text(yaml.safe_dump(merged(TINY, values)))
    return str(path)


@pytest.fixture(scope="module")
def scored_workdir(tmp_path_factory) -> Path:
    """A workdir where Snakemake has really run score_rl_pool (so it holds the job's params) and select_rl_data."""
    from agentrl.config import load_config
    from agentrl.data.prompts import CODE_INTERPRETER_TOOL
    from agentrl.model.build import save_embedded_model, train_tokenizer

    workdir = tmp_path_factory.mktemp("workflow")
    (workdir / "Snakefile").write_text(WRAPPER)
    problems = [
        Problem(
            f"p{i:03d}",
            "embedded-arith",
            [{"role": "user", "content": f"Compute {i} + 1."}],
            "math",
            str(i + 1),
            {"family": "arith", "level": 1 + i % 5},
        )
        for i in range(27)
    ]
    write_records(problems, workdir / "results/data/rl_pool.parquet")
    renderer = train_tokenizer(["0123456789"], 300, "qwen3")  # renders the corpus the real tokenizer learns from
    corpus = [
        renderer.apply_chat_template(
            p.prompt, tools=[CODE_INTERPRETER_TOOL], add_generation_prompt=True, tokenize=False
        )
        for p in problems
    ]
    save_embedded_model(corpus, load_config({}).model.embedded, seed=0, out_dir=workdir / "results/models/sft")
    time.sleep(1.1)  # outputs must be newer than inputs at the file system's time resolution
    _snakemake(workdir, "results/filter/pass_rates.parquet", "--configfile", _override(workdir, "tiny.yaml", TINY))
    # The untrained model solves nothing, which leaves no problem in the band; the table is
    # replaced by one with every pass rate 0/8 .. 8/8 (Snakemake's record of the scoring job,
    # which is what these tests are about, stays). The selection then really runs.
    rows = [
        {
            "problem_id": p.id,
            "sample_index": j,
            "acc": j < i % (K + 1),
            "score": 1.0,
            "tool_calls": 1,
            "response_length": 50,
        }
        for i, p in enumerate(problems)
        for j in range(K)
    ]
    write_pass_rates(pass_rate_table(problems, rows, K), workdir / "results/filter/pass_rates.parquet")
    out = _snakemake(workdir, "results/filter/rl_train.parquet", "--configfile", str(workdir / "tiny.yaml"))
    assert (
        "rule select_rl_data:" in out and "rule score_rl_pool:" not in out and "rule gather_pass_rates:" not in out
    ), out
    return workdir


def test_the_selection_runs_and_an_unchanged_config_has_nothing_to_do(scored_workdir):
    stats = json.loads((scored_workdir / "results/filter/stats.json").read_text())
    assert stats["selected"]["total"] == sum(0 < i % (K + 1) < K for i in range(27))  # 0/8 and 8/8 dropped
    assert (scored_workdir / "results/filter/pass_rate_hist.png").stat().st_size > 10_000
    unchanged = _snakemake(
        scored_workdir, "results/filter/rl_train.parquet", "-n", "--configfile", str(scored_workdir / "tiny.yaml")
    )
    assert set(job_counts(unchanged)) == set(), unchanged


@pytest.mark.parametrize(
    "change",
    [
        {"filter": {"low": 0.2}},
        {"filter": {"high": 0.9, "easy_min": 0.8}},
        {"filter": {"target_histogram": {"easy": 1, "medium": 2, "hard": 1}, "target_size": 12}},
    ],
)
def test_a_threshold_or_target_change_reruns_only_the_selection(scored_workdir, change):
    override = _override(scored_workdir, "override.yaml", change)
    out = _snakemake(scored_workdir, "results/filter/rl_train.parquet", "-n", "--configfile", override)
    assert set(job_counts(out)) == {"select_rl_data"}, out
    assert "Params have changed" in out


@pytest.mark.parametrize("change", [{"filter": {"k": 4}}, {"rollout": {"top_k": 20}}, {"seed": 1}])
def test_a_change_of_the_rollouts_reruns_the_scoring_too(scored_workdir, change):
    override = _override(scored_workdir, "override.yaml", change)
    out = _snakemake(scored_workdir, "results/filter/rl_train.parquet", "-n", "--configfile", override)
    assert set(job_counts(out)) == {"score_rl_pool", "gather_pass_rates", "scoring_config", "select_rl_data"}, out
