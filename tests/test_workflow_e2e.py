"""The whole workflow, end to end, through Snakemake: every rule runs for real on a small config.

The config is the embedded default made smaller (one family, fewer problems, a few GRPO steps),
so this checks the wiring - every rule's inputs, outputs, params and shell line - and that each
stage's output is what the next stage reads. Learning itself is checked by the stage tests and by
the full embedded default (README). Slow: a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from helpers.report_links import broken_links
from helpers.workflows import UPSTREAM_OF_EVAL, run_snakemake, snakemake, write_config

pytestmark = pytest.mark.slow

SMALL = {
    "data": {
        "embedded": {
            "families": ["arith", "program"],
            "sft_per_family": 8,
            "rl_pool_per_family": 6,
            "eval_per_family": 4,
        }
    },
    "model": {"embedded": {"pretrain": {"conversations": 32}}},  # 4 pretraining steps of 8
    "sandbox": {"workers": 2},
    "rollout": {"max_response_tokens": 128, "max_turns": 2},
    "reward": {"overlong": {"max_response_length": 128, "buffer_length": 32}},
    "sft": {"epochs": 2},
    # The barely trained model solves next to nothing: keep unsolved problems so GRPO has data.
    "filter": {"k": 2, "low": -1.0},
    "grpo": {
        "max_steps": 2,
        "batch_prompts": 2,
        "n": 2,
        "mini_batch_prompts": 2,
        "test_freq": 0,
        "val_before_train": False,
        "save_freq": 1,
    },
    "eval": {"n": 2, "models": ["base", "sft", "rl"]},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("workflow")
    write_config(workdir, SMALL)
    snakemake(workdir, timeout=1800)
    return workdir


def test_every_stage_wrote_its_outputs(run):
    results = run / "results"
    for model in ("base", "sft", "rl"):
        assert (results / "models" / model / "model.safetensors").exists(), model
        for family in ("arith", "program"):
            metrics = json.loads((results / "eval" / model / family / "metrics.json").read_text())
            assert metrics["num_problems"] == 4 and metrics["samples_per_problem"] == 2
    assert (results / "eval" / "rl" / "program" / "livecodebench_custom_outputs.json").exists()
    assert (results / "filter" / "rl_train.parquet").exists()
    _assert_the_selection_accounts_for_the_pool(results)
    rl_steps = [json.loads(line) for line in (results / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rl_steps if "step" in m and not any(k.startswith("val/") for k in m)][-1] == 2
    assert (results / "report" / "summary.md").exists()
    for table in ("summary.md", "health.md", "cost.md"):  # what a reader of the summary follows, it finds
        assert broken_links(results / "report" / table) == [], table
    assert list((results / "timings").glob("*.tsv")), "every rule writes a benchmark file"


def _assert_the_selection_accounts_for_the_pool(results):
    """stats.json counts what the scoring and the selection did: every fitted pool problem scored
    k times, each dropped one counted by its reason, the selected ones exactly rl_train's rows."""
    import pandas as pd

    pool = pd.read_parquet(results / "data" / "rl_pool.parquet")
    rates = pd.read_parquet(results / "filter" / "pass_rates.parquet")
    selected = pd.read_parquet(results / "filter" / "rl_train.parquet")
    stats = json.loads((results / "filter" / "stats.json").read_text())
    assert stats["k"] == [SMALL["filter"]["k"]] and set(rates["id"]) == set(pool["id"]), stats["k"]
    assert stats["scored"]["total"] == len(rates) == len(pool)
    assert stats["dropped_at_or_below_low"] == 0, "filter.low is -1: no pass rate is at or below it"
    assert stats["dropped_at_or_above_high"] == int((rates["pass_rate"] >= stats["thresholds"]["high"]).sum())
    in_band = stats["scored"]["total"] - stats["dropped_at_or_above_high"]
    assert stats["in_band"]["total"] == in_band
    assert stats["selected"]["total"] == in_band - stats["resampled_out"] == len(selected) > 0
    assert set(selected["id"]) <= set(pool["id"])
    buckets = ("easy", "medium", "hard")
    assert sum(stats["selected"][b] for b in buckets) == len(selected), stats["selected"]


# The progress lines of agentrl.progress in a log file: count, percent, rate (or, below 0.1 a
# second, seconds per unit) and time left.
PROGRESS = r"agentrl\.\w+: {desc}: \d+/\d+ \w+ \(\d+%\) \| [\d.e+]+ (\w+/s|s/\w+) \| elapsed \w+ \| ETA \w+"


@pytest.mark.parametrize(
    "logs, desc",
    [("grpo.log", "grpo"), ("score_rl_pool/*.log", r"filter\.score"), ("evaluate/*/*/*.log", r"evaluate\.\w+")],
    ids=["grpo", "score_rl_pool", "evaluate"],
)
def test_stages_log_progress_lines_with_a_rate_and_an_eta(run, logs, desc):
    """Under Snakemake (stderr to results/logs/) a stage logs plain lines, not a carriage-return bar."""
    files = sorted((run / "results" / "logs").glob(logs))
    assert files, logs
    for path in files:
        lines = path.read_text().split("\n")  # not splitlines(): it would split at a carriage return too
        assert any(re.search(PROGRESS.format(desc=desc), line) for line in lines), f"{path}:\n" + "\n".join(lines)
        # neither the stage's bar nor the libraries' (transformers loading and saving weights)
        assert not [line for line in lines if "\r" in line], f"{path}: a carriage-return stream in a log file"


def test_a_second_run_has_nothing_to_do(run):
    done = run_snakemake(run, "-n")
    assert done.returncode == 0
    assert "Nothing to be done" in done.stdout + done.stderr


def test_changing_an_eval_value_reruns_only_evaluation_and_what_follows(run):
    override = run / "override.yaml"
    override.write_text(yaml.safe_dump({"eval": {"n": 3}}))
    done = run_snakemake(run, "-n", "--configfile", str(run / "config.yaml"), str(override))
    assert done.returncode == 0, done.stderr
    plan = done.stdout + done.stderr
    assert "evaluate" in plan and "report" in plan
    for upstream_rule in sorted(UPSTREAM_OF_EVAL):
        assert f"rule {upstream_rule}:" not in plan and f"\n{upstream_rule} " not in plan, upstream_rule


def check_health_and_cost(results, report_html) -> None:
    """The report's health and cost sections of a finished run (``results``) and its HTML report."""
    import pandas as pd

    cost = pd.read_csv(results / "report" / "cost.csv").set_index("rule")
    timed = {
        p.relative_to(results / "timings").parts[0].removesuffix(".tsv") for p in (results / "timings").rglob("*.tsv")
    }
    assert set(cost.index) == (timed - {"report"}) | {"total"}, "a row per rule that wrote a benchmark file"
    assert (cost["wall_s"] > 0).all() and (cost["cpu_h"] >= 0).all()
    # Snakemake samples a job's CPU time while it runs: a job of a second or two can end before
    # its first sample and record none, so only the long stages must show CPU time.
    assert (cost.loc[["pretrain", "sft", "grpo", "evaluate", "total"], "cpu_h"] > 0).all()
    for rule in ("score_rl_pool", "evaluate", "grpo"):
        assert cost.loc[rule, "generated_tokens"] > 0 and cost.loc[rule, "tokens_per_s"] > 0, rule
    for rule in ("pretrain", "sft", "grpo"):
        assert cost.loc[rule, "trained_tokens"] > 0 and cost.loc[rule, "mfu_pct"] > 0, rule
    health = pd.read_csv(results / "report" / "health.csv")
    evaluated = {(p.parent.parent.name, p.parent.name) for p in (results / "eval").glob("*/*/metrics.json")}
    assert health["stage"].iloc[0] == "grpo rollouts"
    assert {(s.removeprefix("evaluate "), b) for s, b in zip(health["stage"][1:], health["benchmark"][1:])} == evaluated
    assert (health["infra_failure_pct"].fillna(0) == 0).all() and (health["left_out"] == 0).all()
    html = report_html.read_text()
    for name in ("health.md", "health.csv", "tool_health_rl.png", "cost.md", "cost.csv"):
        assert name in html, f"snakemake --report lacks {name}"


def test_the_report_shows_tool_health_and_the_cost_of_every_stage(run):
    snakemake(run, "--report", str(run / "report.html"), timeout=600)
    check_health_and_cost(run / "results", run / "report.html")
