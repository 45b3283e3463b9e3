"""Reward shaping terms added on top of a verifier's raw score (docs/recipe.md section 4).

Two terms, applied in the order upstream applies them:

1. Tool-call shaping, inside upstream's ``compute_score``. For a response with ``k`` tool
   rounds, a *negative* score ``s`` becomes ``min(cap, s + per_call * k)`` (upstream: cap -0.6,
   per_call 0.1), so a wrong answer that used tools is punished less, but never above ``cap``.
   Upstream derives ``k`` from ``num_turns = 2k + 2`` and its DAPO reward manager never passes
   ``num_turns``: the default 0 gives ``k = -1``, so in the released runs every wrong answer
   scored ``-1 - 0.1 = -1.1`` and the shaping never rewarded tool use.
   ``call_count: released`` reproduces that (``k = -1`` whatever the response did; the paper
   presets); ``call_count: counted`` uses the real number of executed tool calls, counted by
   the agent loop (the term then does what its code says it is for). A code answer scoring
   ``0`` (code that fails every case) is not negative and is not shaped, as upstream.
   ``correct_bonus`` adds the paper's eq. 8 instead
   of (or besides) it: a correct answer with ``n`` tool calls scores ``s + per_call * n``
   (``1 + 0.1 n``). The two switches are independent: ``enable`` turns on the wrong-answer
   term, ``correct_bonus`` the correct-answer term.
2. DAPO overlong buffer, added by upstream's reward manager after ``compute_score``. With
   ``L`` the response length in tokens (tool-response tokens included, as upstream counts the
   whole response span), ``L_max`` and buffer ``L_cache``:
   ``penalty = min(-(L - (L_max - L_cache)) / L_cache * factor, 0)``. The penalty is not
   floored at ``-factor``: a length beyond ``L_max`` cannot happen with a budget of ``L_max``,
   and upstream does not floor it either.

Both are pure functions of numbers so that they can be checked against the formulas at the
boundaries without a model.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.config import ConfigError, OverlongConfig, RewardConfig, ToolCallShapingConfig


def check_overlong_config(cfg: OverlongConfig) -> None:
    """Cross-field check the schema cannot express; raise ConfigError naming the keys."""
    if cfg.enable and cfg.buffer_length > cfg.max_response_length:
        raise ConfigError(
            f"reward.overlong.buffer_length ({cfg.buffer_length}) exceeds "
            f"reward.overlong.max_response_length ({cfg.max_response_length}); the buffer is the "
            "tail of the response budget, so it must not be longer than the budget"
        )


def overlong_penalty(response_length: int, cfg: OverlongConfig) -> float:
    """DAPO soft overlong punishment: ``min(-(L - (L_max - L_cache)) / L_cache * factor, 0)``.

    ``0`` up to ``L_max - L_cache`` tokens, then linear down to ``-factor`` at ``L_max``.
    """
    if response_length < 0:
        raise ValueError(f"response_length must be >= 0, got {response_length}")
    if not cfg.enable:
        return 0.0
    expected_length = cfg.max_response_length - cfg.buffer_length
    exceed = response_length - expected_length
    return min(-exceed / cfg.buffer_length * cfg.penalty_factor, 0.0)


RELEASED_CALL_COUNT = -1  # upstream: (num_turns - 2) / 2 with num_turns never passed (0)


def tool_call_shaped_score(raw_score: float, acc: bool, num_tool_calls: int, cfg: ToolCallShapingConfig) -> float:
    """The score after tool-call shaping (see the module docstring for both terms)."""
    if num_tool_calls < 0:
        raise ValueError(f"num_tool_calls must be >= 0, got {num_tool_calls}")
    if acc:
        if cfg.correct_bonus:
            return raw_score + cfg.per_call * num_tool_calls
        return raw_score
    if cfg.enable and raw_score < 0:
        k = RELEASED_CALL_COUNT if cfg.call_count == "released" else num_tool_calls
        return min(cfg.cap, raw_score + cfg.per_call * k)
    return raw_score


@dataclass(frozen=True)
class ShapedScore:
    score: float
    tool_shaping: float  # what tool-call shaping added (may be negative: cap below the raw score)
    overlong_penalty: float  # <= 0


def shape(raw_score: float, acc: bool, *, response_length: int, num_tool_calls: int, cfg: RewardConfig) -> ShapedScore:
    """Tool-call shaping, then the overlong penalty, in upstream's order."""
    after_tools = tool_call_shaped_score(raw_score, acc, num_tool_calls, cfg.tool_call_shaping)
    penalty = overlong_penalty(response_length, cfg.overlong)
    return ShapedScore(score=after_tools + penalty, tool_shaping=after_tools - raw_score, overlong_penalty=penalty)
