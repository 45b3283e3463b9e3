"""The released-model presets through Snakemake, with local folders standing in for the hub ids.

No network here: tiny models built by the package's own builder (tests/helpers/released.py)
take the place of Gen-Verse/DemyAgent-4B, Qwen/Qwen3-4B-Instruct-2507 and
Gen-Verse/Qwen3-4B-RA-SFT, and the upstream data sources are the fixture files (tests/fixtures).
What the issue asks of the presets: the dry run of each lists exactly its jobs (no sft job with
sft.from set; for the eval preset nothing but the eval data, the two model links, evaluation and
the report); a rehearsal-size run of the eval preset writes a report with the published figures;
changing sft.from re-runs the prompt fits (its tokenizer measures them), scoring, GRPO and the evaluation of the models built on it, nothing else.
Slow: each Snakemake call pays its start-up, the real runs a few minutes on 2 cores.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers.released import build_fixture_model
from helpers.workflows import TINY, jobs_in_listing, merged, models_of, planned, rules_of, snakemake, write_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
BENCHMARKS = ("aime2024", "aime2025", "gpqa_diamond", "livecodebench_v6")
RELEASED = ("DemyAgent-4B", "Qwen3-4B-Instruct-2507")
# The upstream sources, read from the fixture files instead of the hub.
FIXTURE_DATA = {
    "data": {
        "upstream": {
            "sft": {"id": str(FIXTURES / "sft.parquet"), "file": None},
            "rl": {"id": str(FIXTURES / "rl.parquet"), "file": None},
            "eval": {
                "aime2024": {"id": str(FIXTURES / "eval/aime2024/aime_2024_problems.parquet")},
                "aime2025": {"id": str(FIXTURES / "eval/aime2025/aime_2025_problems.parquet")},
                "gpqa_diamond": {"id": str(FIXTURES / "eval/gpqa-diamond/gpqa_diamond.parquet")},
                "livecodebench_v6": {"id": str(FIXTURES / "eval/livecodebench-v6/lcb_v6_2502_2505.parquet")},
            },
        }
    }
}
# Rehearsal budgets: the paper preset's settings, with a CPU engine, short answers and few samples.
REHEARSAL = {
    "sandbox": {"workers": 2},
    "rollout": {"engine": "hf", "dtype": "auto", "max_turns": 2, "max_response_tokens": 24},
    "reward": {"overlong": {"max_response_length": 24, "buffer_length": 8}},
    "eval": {"n": 2},
}


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> dict[str, Path]:
    """One tiny model folder per released model (different seeds: different weights)."""
    root = tmp_path_factory.mktemp("stand_ins")
    names = (*RELEASED, "Qwen3-4B-RA-SFT", "other-SFT")
    return {name: build_fixture_model(root / name, seed=seed) for seed, name in enumerate(names)}


def preset_config(workdir: Path, preset: str, overlay: dict) -> Path:
    """workdir/config.yaml = config.yaml + the Qwen3 paper preset + ``preset`` + fixture data + ``overlay``."""
    presets = [yaml.safe_load((ROOT / "presets" / name).read_text()) for name in ("paper-qwen3-4b.yaml", preset)]
    return write_config(workdir, *presets, FIXTURE_DATA, overlay)


def released_checkpoints(stand_ins: dict[str, Path]) -> dict:
    """The eval preset's checkpoints, and model.base (its tokenizer measures the prompts: fit_*_prompts)."""
    return {
        "model": {"base": str(stand_ins["Qwen3-4B-Instruct-2507"]), "revision": None},  # a folder has no revision
        "eval": {"checkpoints": {name: {"id": str(stand_ins[name]), "revision": None} for name in RELEASED}},
    }


def test_eval_released_preset_plans_evaluation_and_the_report_only(stand_ins, tmp_path):
    preset_config(tmp_path, "paper-eval-released.yaml", released_checkpoints(stand_ins))
    jobs = planned(tmp_path)
    counts = Counter(rule for rule, _ in jobs)
    assert counts == {
        "prepare_data": 1,  # the eval sets
        "base_model": 1,  # Qwen3-4B-Instruct-2507 linked: its tokenizer measures the prompts
        "fit_eval_prompts": 1,  # overlong eval prompts dropped
        "fetch_checkpoint": 2,  # the two released models, linked by local jobs
        "evaluate": 16,  # one shard job per (model, half, benchmark) at eval.shards 1
        "gather_evaluation": 16,
        "export_livecodebench": 4,
        "report": 1,
    }
    assert models_of(jobs, "evaluate") == set(RELEASED)
    # Both halves of the model card's table: agentic in eval/<model>/<benchmark>/, self-contained
    # in eval/<model>/self_contained/<benchmark>/.
    for rule in ("evaluate", "gather_evaluation"):
        assert {(w["model"], w["half"], w["benchmark"]) for r, w in jobs if r == rule} == {
            (m, half, b) for m in RELEASED for half in ("", "self_contained/") for b in BENCHMARKS
        }


def test_rl_from_released_sft_preset_plans_no_sft_job(stand_ins, tmp_path):
    sft_from = {
        "model": {"base": str(stand_ins["Qwen3-4B-Instruct-2507"]), "revision": None},  # a folder has no revision
        "sft": {"from": {"id": str(stand_ins["Qwen3-4B-RA-SFT"]), "revision": None}},
    }
    preset_config(tmp_path, "paper-rl-from-released-sft.yaml", sft_from)
    jobs = planned(tmp_path)
    counts = Counter(rule for rule, _ in jobs)
    assert counts == {
        "prepare_data": 1,  # no base_model: the released SFT model's tokenizer measures the prompts
        "fit_rl_prompts": 1,
        "fit_eval_prompts": 1,
        "released_sft": 1,
        "scoring_config": 1,
        "score_rl_pool": 32,  # the paper preset's filter.shards
        "gather_pass_rates": 1,
        "select_rl_data": 1,
        "grpo": 1,
        "evaluate": 8,
        "gather_evaluation": 8,
        "export_livecodebench": 2,
        "report": 1,
    }
    assert models_of(jobs, "evaluate") == {"sft", "rl"}


@pytest.mark.long  # a whole run; CI: the eval preset's plan (test_eval_released_preset_plans_...)
@pytest.mark.timeout(1800)  # a real run of the eval preset (up to 1200 s on a loaded machine)
def test_rehearsal_of_the_eval_preset_reports_the_published_figures(stand_ins, tmp_path):
    preset_config(tmp_path, "paper-eval-released.yaml", merged(released_checkpoints(stand_ins), REHEARSAL))
    done = snakemake(tmp_path, timeout=1200)
    ran = Counter(rule for rule, _ in jobs_in_listing(done.stdout + done.stderr))
    assert set(ran) == {
        "prepare_data",
        "base_model",
        "fit_eval_prompts",
        "fetch_checkpoint",
        "evaluate",
        "gather_evaluation",
        "export_livecodebench",
        "report",
    }
    results = tmp_path / "results-eval-released"
    source = json.loads((results / "models/checkpoints/DemyAgent-4B/config.json").read_text())["agentrl_source"]
    assert source["id"] == str(stand_ins["DemyAgent-4B"])

    frame = pd.read_csv(results / "report" / "summary.csv")
    assert len(frame) == 16, "both released models in both halves on every benchmark"
    compared = frame.dropna(subset=["published"])
    assert len(compared) == 12, "the model card has no self-contained DemyAgent-4B row"
    assert set(frame.loc[frame["reasoning"] == "self_contained", "tool_calls_per_response"]) == {0.0}
    no_tool = compared[compared["reasoning"] == "self_contained"].set_index("benchmark")
    assert set(no_tool["model"]) == {"Qwen3-4B-Instruct-2507"}
    assert no_tool["published"].to_dict() == {
        "aime2024": 63.3,
        "aime2025": 47.4,
        "gpqa_diamond": 52.0,
        "livecodebench_v6": 35.1,
    }
    compared = compared[compared["reasoning"] == "agentic"]
    demy = compared[compared["model"] == "DemyAgent-4B"].set_index("benchmark")
    assert demy["published"].to_dict() == {
        "aime2024": 72.6,
        "aime2025": 70.0,
        "gpqa_diamond": 58.5,
        "livecodebench_v6": 26.8,
    }
    assert (demy["difference"] - (demy["avg@n"] - demy["published"])).abs().max() < 0.01
    qwen = compared[compared["model"] == "Qwen3-4B-Instruct-2507"].set_index("benchmark")
    assert qwen.loc["aime2024", "published"] == 17.9 and qwen.loc["livecodebench_v6", "published"] == 23.0
    md = (results / "report" / "summary.md").read_text()
    assert "## Measured and published" in md
    assert "| DemyAgent-4B | Gen-Verse/DemyAgent-4B | aime2024 |" in md
    assert "| Qwen3-4B-Instruct-2507 | Qwen/Qwen3-4B-Instruct-2507 | gpqa_diamond |" in md
    assert f"| DemyAgent-4B | {stand_ins['DemyAgent-4B']} | - | - |" in md, "where the released model came from"


@pytest.fixture(scope="module")
def completed_from_sft(stand_ins, tmp_path_factory):
    """The tiny embedded workflow, run to the end with sft.from = a stand-in released SFT model.

    It evaluates what presets/paper-rl-from-released-sft.yaml evaluates (sft and rl, not base), so
    no base model is built and the released SFT model's tokenizer measures the prompts.
    """
    workdir = tmp_path_factory.mktemp("from_sft")
    # The stand-in's tokenizer (trained on three lines) needs more tokens for a prompt than the
    # embedded base model's.
    limits = {"rollout": {"max_prompt_tokens": 2048}, "eval": {"max_prompt_tokens": 2048, "models": ["sft", "rl"]}}
    write_config(workdir, TINY, {"sft": {"from": str(stand_ins["Qwen3-4B-RA-SFT"])}, **limits})
    done = snakemake(workdir, timeout=1200)
    assert "sft" not in rules_of(jobs_in_listing(done.stdout + done.stderr))
    assert planned(workdir) == [], "a finished run plans nothing"
    return workdir


@pytest.mark.long  # a whole run; CI: test_reruns' changed-parameter cases
@pytest.mark.timeout(1800)  # its fixture runs the whole tiny DAG (up to 1200 s on a loaded machine)
def test_a_changed_sft_from_reruns_what_is_built_on_the_sft_model_only(completed_from_sft, stand_ins, tmp_path):
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump({"sft": {"from": str(stand_ins["other-SFT"])}}))
    jobs = planned(completed_from_sft, "--configfile", str(completed_from_sft / "config.yaml"), str(override))
    expected = {
        "released_sft",
        "fit_rl_prompts",  # the released SFT model's tokenizer measures the prompts (no base model)
        "fit_eval_prompts",
        "score_rl_pool",
        "gather_pass_rates",
        "scoring_config",
        "select_rl_data",
        "grpo",
        "evaluate",
        "gather_evaluation",
        "export_livecodebench",
        "report",
    }
    assert rules_of(jobs) == expected, "not the data preparation"
    assert models_of(jobs, "evaluate") == {"sft", "rl"} == models_of(jobs, "export_livecodebench")
    assert TINY["data"]["embedded"]["families"] == ["arith", "program"]
    assert len(jobs) == 1 + 2 + 5 + 2 * 2 * 2 + 2 + 1, (
        "one job each: link, the two prompt fits, score, gather, scoring config, select, grpo; "
        "4 evaluations and their 4 gathers, 2 exports, the report"
    )
