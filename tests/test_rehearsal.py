"""The paper rehearsal: the whole DAG of the paper preset on fixture files and a tiny model, on CPU.

``presets/rehearsal.yaml`` overlays ``presets/paper-qwen3-4b.yaml`` with fixture data in the
released schemas, a tiny Qwen3-template model and tiny budgets; every rule of the paper run runs
(upstream loaders, prompt fitting, SFT on DeepSpeed, filtering, GRPO-TCR, evaluation, the
LiveCodeBench export, the report). Run from the repository root, as a user would from a clone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ["presets/paper-qwen3-4b.yaml", "presets/rehearsal.yaml"]
# The released scripts' rules on the same fixtures: the as-released overlay before the rehearsal's swaps.
AS_RELEASED_PRESETS = ["presets/paper-qwen3-4b.yaml", "presets/paper-as-released.yaml", "presets/rehearsal.yaml"]
# The whole DAG: about 3 CPU-minutes of work (25 jobs, most of it process start-up); on a loaded
# 2-core machine 10-12 minutes of wall time, beyond pytest-timeout's default of 600 s.
WHOLE_DAG_TIMEOUT_S = 2400


def _run_rehearsal(tmp_path_factory, presets: list[str]) -> Path:
    results = tmp_path_factory.mktemp("rehearsal") / "results"
    override = results.parent / "results_dir.yaml"
    override.write_text(yaml.safe_dump({"results_dir": str(results)}))
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", *presets, str(override)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=WHOLE_DAG_TIMEOUT_S)
    assert done.returncode == 0, f"rehearsal failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return results


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> Path:
    return _run_rehearsal(tmp_path_factory, PRESETS)


@pytest.fixture(scope="module")
def as_released_rehearsal(tmp_path_factory) -> Path:
    return _run_rehearsal(tmp_path_factory, AS_RELEASED_PRESETS)


@pytest.mark.slow
@pytest.mark.timeout(WHOLE_DAG_TIMEOUT_S)
def test_every_stage_of_the_paper_dag_ran(rehearsal):
    for output in (
        "models/base/config.json",
        "models/sft/config.json",
        "filter/rl_train.parquet",
        "filter/stats.json",
        "rl/metrics.jsonl",
        "models/rl/config.json",
        "eval/rl/livecodebench_v6/livecodebench_custom_outputs.json",
        "report/summary.md",
    ):
        assert (rehearsal / output).is_file(), output
    for model in ("base", "sft", "rl"):
        for benchmark in ("aime2024", "aime2025", "gpqa_diamond", "livecodebench_v6"):
            metrics = json.loads((rehearsal / f"eval/{model}/{benchmark}/metrics.json").read_text())
            assert metrics["samples_per_problem"] == 2
            assert metrics["run"]["max_prompt_tokens"] == 4096  # the eval limit, not the RL one


@pytest.mark.slow
@pytest.mark.timeout(WHOLE_DAG_TIMEOUT_S)
def test_overlong_prompts_were_dropped_and_counted_per_source(rehearsal):
    rl = json.loads((rehearsal / "data/prompt_lengths/rl_pool.json").read_text())["rl_pool"]
    assert (rl["limit"], rl["with_tools"], rl["dropped_by_source"]) == (2560, False, {"train-math-deepscaler": 1})
    lcb = json.loads((rehearsal / "data/prompt_lengths/eval.json").read_text())["livecodebench_v6"]
    assert (lcb["limit"], lcb["kept"], lcb["dropped_by_source"]) == (4096, 1, {"LiveCodeBench_v6": 1})
    pool = pd.read_parquet(rehearsal / "data/rl_pool.parquet")
    assert len(pool) == 7 and "train-math-deepscaler" not in set(pool["data_source"])


@pytest.mark.slow
@pytest.mark.timeout(WHOLE_DAG_TIMEOUT_S)
def test_paper_rules_held(rehearsal):
    pool = pd.read_parquet(rehearsal / "data/rl_pool.parquet")
    # per-file wrapping: the RL file starts with math_dapo, so every row gets only the units sentence
    code_prompt = json.loads(pool.loc[pool["data_source"] == "train-code-taco-easy", "prompt"].iloc[0])
    assert code_prompt[0]["content"].endswith("without any units.")
    steps = [json.loads(line) for line in (rehearsal / "rl/metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "val/mean/avg@1" in s][:1] == [0]  # validation before training
    summary = (rehearsal / "report/summary.md").read_text()
    assert "| rl | Gen-Verse/DemyAgent-4B | aime2024 |" in summary  # the published figures beside ours
    assert "Grading: math strict, choice exact" in summary


@pytest.mark.long  # a second paper rehearsal; CI: the first one and the overlay's validation
@pytest.mark.slow
@pytest.mark.timeout(WHOLE_DAG_TIMEOUT_S)
def test_the_as_released_overlay_runs_end_to_end_on_the_fitted_pool(as_released_rehearsal):
    results = as_released_rehearsal
    for output in ("models/sft/config.json", "rl/metrics.jsonl", "models/rl/config.json", "report/summary.md"):
        assert (results / output).is_file(), output
    assert not (results / "filter").exists(), "the released run computes no pass rates"
    steps = [json.loads(line) for line in (results / "rl/metrics.jsonl").read_text().splitlines()]
    assert any("actor/pg_loss" in step for step in steps), "GRPO updated on the pool"
    for benchmark in ("aime2024", "aime2025", "gpqa_diamond", "livecodebench_v6"):
        assert (results / f"eval/rl/{benchmark}/metrics.json").is_file(), benchmark


def test_the_overlay_validates_and_its_fixtures_exist_relative_to_the_repository():
    from helpers.presets import resolved

    cfg = resolved("paper-qwen3-4b.yaml", "rehearsal.yaml")
    up = cfg.data.upstream
    for source in (up.sft, up.rl, *up.eval.values()):
        assert not Path(source.id).is_absolute() and (ROOT / source.id).is_file(), source.id
    assert set(up.eval) == {"aime2024", "aime2025", "gpqa_diamond", "livecodebench_v6"}
    # the paper's rules stay: only data, model, engine and budgets are swapped
    paper = resolved("paper-qwen3-4b.yaml")
    assert cfg.reward.tool_call_shaping == paper.reward.tool_call_shaping
    assert (cfg.reward.choice_mode, cfg.reward.math_mode) == (paper.reward.choice_mode, paper.reward.math_mode)
    assert (cfg.rollout.max_prompt_tokens, cfg.eval.max_prompt_tokens) == (2560, 4096)
    assert cfg.rollout.tool_response_over_budget == "drop" and cfg.data.upstream.rl_prompt_wrapping == "per_file"
    assert cfg.grpo.variant == "grpo_tcr" and cfg.eval.top_p == 0.6
