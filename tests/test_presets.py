"""The paper presets resolve to the values of docs/recipe.md (sections 3-7)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.presets import resolved

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def paper():
    return resolved("paper-qwen3-4b.yaml")


def test_data_and_model(paper):
    assert paper.data.source == "upstream"
    assert paper.data.upstream.sft.id == "Gen-Verse/Open-AgentRL-SFT-3K"
    assert paper.data.upstream.rl.id == "Gen-Verse/Open-AgentRL-30K"
    assert set(paper.data.benchmarks) == {"aime2024", "aime2025", "gpqa_diamond", "livecodebench_v6"}
    assert paper.model.base == "Qwen/Qwen3-4B-Instruct-2507"
    # Pinned by commit (40 hex digits), so a hub update does not change the run; the file names stay.
    for source in (paper.data.upstream.sft, paper.data.upstream.rl):
        assert len(source.revision) == 40 and int(source.revision, 16) >= 0, source
    assert paper.data.upstream.sft.file == "full_sft_3k_shuffled_v4.parquet"
    assert len(paper.model.revision) == 40


def test_tool_reward_and_rollout(paper):
    assert (paper.sandbox.timeout_s, paper.sandbox.memory_mb) == (30, 2048)
    assert paper.tool.max_output_chars == 256
    assert paper.reward.math_mode == "strict" and paper.reward.strict_tail_chars == 100
    overlong = paper.reward.overlong
    assert (overlong.max_response_length, overlong.buffer_length, overlong.penalty_factor) == (20480, 4096, 1.0)
    shaping = paper.reward.tool_call_shaping  # as released: k = -1, every wrong answer -1.1
    assert (shaping.enable, shaping.call_count, shaping.correct_bonus) == (True, "released", False)
    assert (paper.reward.choice_mode, paper.reward.unknown_source) == ("exact", "math")
    r = paper.rollout
    assert (r.max_turns, r.max_prompt_tokens, r.max_response_tokens) == (16, 2560, 20480)
    assert (r.temperature, r.top_p) == (1.0, 1.0)


def test_sft_hyperparameters(paper):
    s = paper.sft
    assert (s.lr, s.lr_schedule, s.warmup_ratio) == (1e-5, "cosine", 0.1)
    assert tuple(s.betas) == (0.9, 0.95) and s.weight_decay == 0.01 and s.grad_clip == 1.0
    assert (s.global_batch_size, s.micro_batch_size, s.epochs, s.max_length) == (32, 4, 5, 32768)
    assert s.truncation == "right"


def test_grpo_tcr_hyperparameters(paper):
    g = paper.grpo
    assert g.variant == "grpo_tcr" and g.dynamic_sampling.enable is False
    assert (g.batch_prompts, g.n, g.mini_batch_prompts, g.ppo_epochs, g.epochs) == (64, 16, 16, 1, 3)
    assert (g.lr, g.lr_schedule, g.weight_decay, g.grad_clip) == (1e-6, "constant", 0.01, 1.0)
    assert (g.test_freq, g.save_freq) == (10, 30)
    v = g.validation
    assert (v.n, v.temperature, v.top_p) == (32, 1.0, 0.6)


def test_grpo_tcr_variant_resolves_to_the_script_values(paper):
    from agentrl.grpo.variants import resolve_algorithm

    algo = resolve_algorithm(paper.grpo)
    assert (algo.clip_low, algo.clip_high, algo.clip_c) == (0.2, 0.28, 10.0)
    assert algo.loss_agg_mode == "token-mean" and algo.kl_coef == 0.0 and algo.entropy_coef == 0.0


def test_filter_and_eval(paper):
    f = paper.filter
    assert (f.k, f.low, f.high, f.easy_min, f.hard_max) == (8, 0.0, 1.0, 0.75, 0.25)
    e = paper.eval
    assert (e.n, e.temperature, e.top_p) == (32, 1.0, 0.6)


def test_weak_model_preset_matches_the_strong_models_histogram():
    weak = resolved("paper-qwen3-4b.yaml", "paper-qwen2.5-7b.yaml")
    assert weak.model.base == "Qwen/Qwen2.5-7B-Instruct"
    assert weak.filter.target_pass_rates is not None


def test_eval_released_preset_evaluates_the_two_released_models_only():
    released = resolved("paper-qwen3-4b.yaml", "paper-eval-released.yaml")
    assert released.eval.models == ()
    assert {name: source.id for name, source in released.eval.checkpoints.items()} == {
        "DemyAgent-4B": "Gen-Verse/DemyAgent-4B",
        "Qwen3-4B-Instruct-2507": "Qwen/Qwen3-4B-Instruct-2507",
    }
    assert all(source.revision for source in released.eval.checkpoints.values()), "a revision is named"
    qwen = released.eval.checkpoints["Qwen3-4B-Instruct-2507"]
    assert (qwen.id, qwen.revision) == (released.model.base, released.model.revision), "the base model's pin"
    # the published evaluation's sampling, from the paper preset
    assert (released.eval.n, released.eval.temperature, released.eval.top_p) == (32, 1.0, 0.6)
    assert released.results_dir != resolved("paper-qwen3-4b.yaml").results_dir


def test_rl_from_released_sft_preset_skips_sft_only():
    paper = resolved("paper-qwen3-4b.yaml")
    from_sft = resolved("paper-qwen3-4b.yaml", "paper-rl-from-released-sft.yaml")
    assert from_sft.sft.from_.id == "Gen-Verse/Qwen3-4B-RA-SFT" and from_sft.sft.from_.revision
    assert from_sft.eval.models == ("sft", "rl")
    assert (from_sft.filter, from_sft.grpo, from_sft.rollout) == (paper.filter, paper.grpo, paper.rollout)
    assert from_sft.results_dir not in (
        paper.results_dir,
        resolved("paper-qwen3-4b.yaml", "paper-eval-released.yaml").results_dir,
    )


def test_published_mappings_name_entries_of_the_published_file():
    from agentrl.report.tables import read_published

    entries = read_published()
    for presets in (
        ("paper-qwen3-4b.yaml",),
        ("paper-qwen3-4b.yaml", "paper-eval-released.yaml"),
        ("paper-qwen3-4b.yaml", "paper-rl-from-released-sft.yaml"),
    ):
        published = resolved(*presets).eval.published
        assert published and all(name in entries for name in published.values() if name), presets
    assert resolved("paper-qwen3-4b.yaml").eval.published == {
        "rl": "Gen-Verse/DemyAgent-4B",
        "base": "Qwen/Qwen3-4B-Instruct-2507",
    }
    weak = resolved("paper-qwen3-4b.yaml", "paper-qwen2.5-7b.yaml").eval.published
    assert weak == {"rl": None, "base": "Qwen/Qwen2.5-7B-Instruct"}, "Qwen2.5-7B is compared with its own rows only"
