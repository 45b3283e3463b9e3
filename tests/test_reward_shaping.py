"""Shaping terms checked against their formulas (docs/recipe.md section 4) at the boundaries."""

from __future__ import annotations

import pytest

from agentrl.config import ConfigError, check_cross_keys, load_config
from agentrl.data.records import Problem
from agentrl.grpo.variants import grpo_reward_config, resolve_algorithm
from agentrl.rewards import RewardFunction
from agentrl.rewards.shaping import overlong_penalty, shape, tool_call_shaped_score

PAPER_OVERLONG = {"enable": True, "max_response_length": 20480, "buffer_length": 4096, "penalty_factor": 1.0}
UPSTREAM_TOOL_SHAPING = {"enable": True, "per_call": 0.1, "cap": -0.6, "correct_bonus": False}


def reward_cfg(**reward):
    return load_config({"reward": reward}).reward


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (0, 0.0),
        (16383, 0.0),  # below L_max - L_cache
        (16384, 0.0),  # exactly L_max - L_cache: the buffer starts here
        (16385, -1 / 4096),  # one token into the buffer
        (18432, -0.5),  # half the buffer
        (20479, -4095 / 4096),
        (20480, -1.0),  # L_max: the full factor
        (24576, -2.0),  # beyond L_max: not floored, as upstream
    ],
)
def test_overlong_penalty_follows_dapo_formula(length, expected):
    cfg = reward_cfg(overlong=PAPER_OVERLONG).overlong
    assert overlong_penalty(length, cfg) == pytest.approx(expected, abs=1e-12)


def test_overlong_penalty_scales_with_factor_and_can_be_disabled():
    half = reward_cfg(overlong={**PAPER_OVERLONG, "penalty_factor": 0.5}).overlong
    assert overlong_penalty(20480, half) == pytest.approx(-0.5)
    off = reward_cfg(overlong={**PAPER_OVERLONG, "enable": False}).overlong
    assert overlong_penalty(20480, off) == 0.0


def test_overlong_penalty_rejects_negative_length():
    with pytest.raises(ValueError, match="response_length"):
        overlong_penalty(-1, reward_cfg(overlong=PAPER_OVERLONG).overlong)


def test_buffer_longer_than_budget_is_a_config_error_naming_the_keys():
    cfg = reward_cfg(overlong={**PAPER_OVERLONG, "buffer_length": 30000})
    with pytest.raises(ConfigError, match=r"reward\.overlong\.buffer_length .* reward\.overlong\.max_response_length"):
        RewardFunction(cfg)


@pytest.mark.parametrize(
    ("raw", "acc", "calls", "expected"),
    [
        (-1.0, False, 0, -1.0),  # min(-0.6, -1 + 0) : no tool use, no relief
        (-1.0, False, 1, -0.9),
        (-1.0, False, 3, -0.7),
        (-1.0, False, 4, -0.6),  # exactly at the cap
        (-1.0, False, 5, -0.6),  # capped
        (-1.0, False, 16, -0.6),
        (1.0, True, 7, 1.0),  # correct answers untouched without correct_bonus
        (0.5, False, 3, 0.5),  # partial code credit is not negative: untouched
        (0.0, False, 3, 0.0),  # zero is not negative either
    ],
)
def test_tool_call_shaping_for_wrong_answers(raw, acc, calls, expected):
    cfg = reward_cfg(tool_call_shaping=UPSTREAM_TOOL_SHAPING).tool_call_shaping
    assert tool_call_shaped_score(raw, acc, calls, cfg) == pytest.approx(expected, abs=1e-12)


def test_upstream_released_runs_scored_every_wrong_answer_minus_1_1():
    # Upstream computes k = (num_turns - 2) / 2 and never receives num_turns (default 0): k = -1,
    # so min(-0.6, -1 + 0.1 * -1) = -1.1 whatever the response did; call_count: released does that.
    released = reward_cfg(tool_call_shaping={**UPSTREAM_TOOL_SHAPING, "call_count": "released"})
    for calls in (0, 1, 4, 7):
        assert tool_call_shaped_score(-1.0, False, calls, released.tool_call_shaping) == pytest.approx(-1.1)
    # code that fails every case scores 0: not negative, not shaped; correct answers untouched
    assert tool_call_shaped_score(0.0, False, 3, released.tool_call_shaping) == 0.0
    assert tool_call_shaped_score(1.0, True, 3, released.tool_call_shaping) == 1.0
    with pytest.raises(ValueError, match="num_tool_calls"):
        tool_call_shaped_score(-1.0, False, -1, released.tool_call_shaping)


def test_tool_call_shaping_disabled_leaves_scores_alone():
    cfg = reward_cfg(tool_call_shaping={**UPSTREAM_TOOL_SHAPING, "enable": False}).tool_call_shaping
    assert tool_call_shaped_score(-1.0, False, 3, cfg) == -1.0


@pytest.mark.parametrize(("calls", "expected"), [(0, 1.0), (1, 1.1), (3, 1.3), (10, 2.0)])
def test_paper_eq8_correct_bonus(calls, expected):
    cfg = reward_cfg(tool_call_shaping={**UPSTREAM_TOOL_SHAPING, "enable": False, "correct_bonus": True})
    assert tool_call_shaped_score(1.0, True, calls, cfg.tool_call_shaping) == pytest.approx(expected)
    # the bonus is for correct answers only; the wrong-answer term is switched off here
    assert tool_call_shaped_score(-1.0, False, calls, cfg.tool_call_shaping) == -1.0


def test_shape_applies_tool_shaping_then_overlong():
    cfg = reward_cfg(overlong=PAPER_OVERLONG, tool_call_shaping=UPSTREAM_TOOL_SHAPING)
    shaped = shape(-1.0, False, response_length=18432, num_tool_calls=2, cfg=cfg)
    assert shaped.tool_shaping == pytest.approx(0.2)
    assert shaped.overlong_penalty == pytest.approx(-0.5)
    assert shaped.score == pytest.approx(-1.3)


def test_reward_function_reports_shaping_in_details():
    cfg = reward_cfg(overlong=PAPER_OVERLONG, tool_call_shaping={**UPSTREAM_TOOL_SHAPING, "correct_bonus": True})
    reward_fn = RewardFunction(cfg)
    problem = Problem("p1", "AIME2025", [], "math", "70")
    right = reward_fn.score(problem, "... \\boxed{70}", response_length=20480, num_tool_calls=2)
    assert (right.score, right.acc) == (pytest.approx(1.2 - 1.0), True)
    assert right.details["raw_score"] == 1.0
    assert right.details["tool_shaping"] == pytest.approx(0.2)
    assert right.details["overlong_penalty"] == pytest.approx(-1.0)
    wrong = reward_fn.score(problem, "... \\boxed{71}", response_length=100, num_tool_calls=6)
    assert (wrong.score, wrong.acc, wrong.pred) == (pytest.approx(-0.6), False, "71")


@pytest.mark.parametrize(
    ("variant", "enable", "expected_penalty"),
    [
        ("grpo_tcr", True, -1.0),  # the R of TCR: the full factor at the end of the budget
        ("grpo_tcr", False, 0.0),  # reward.overlong.enable: false is off in training too
        ("grpo_t", True, 0.0),  # a variant without R never adds it
    ],
)
def test_grpo_grades_with_the_overlong_penalty_only_where_both_switches_are_on(variant, enable, expected_penalty):
    cfg = load_config({"grpo": {"variant": variant}, "reward": {"overlong": {**PAPER_OVERLONG, "enable": enable}}})
    reward_fn = RewardFunction(grpo_reward_config(cfg.reward, resolve_algorithm(cfg.grpo)))
    wrong = reward_fn.score(
        Problem("p1", "AIME2025", [], "math", "70"), "... \\boxed{71}", response_length=20480, num_tool_calls=0
    )
    assert wrong.details["overlong_penalty"] == pytest.approx(expected_penalty)
    assert wrong.score == pytest.approx(-1.0 + expected_penalty)


def test_the_overlong_length_defaults_to_the_response_budget_and_an_explicit_one_stays():
    assert load_config({"rollout": {"max_response_tokens": 300}}).reward.overlong.max_response_length == 300
    assert load_config({}).reward.overlong.max_response_length == load_config({}).rollout.max_response_tokens
    explicit = load_config(
        {"rollout": {"max_response_tokens": 300}, "reward": {"overlong": {"max_response_length": 200}}}
    )
    assert explicit.reward.overlong.max_response_length == 200


def test_grpo_overlong_shaping_asked_beside_the_penalty_turned_off_is_refused():
    cfg = load_config({"reward": {"overlong": {"enable": False}}, "grpo": {"algorithm": {"overlong_shaping": True}}})
    with pytest.raises(
        ConfigError, match=r"grpo\.algorithm\.overlong_shaping: true .* reward\.overlong\.enable: false"
    ):
        check_cross_keys(cfg)
