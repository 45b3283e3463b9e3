"""Rewards: verifiers by data-source family (math, multiple choice, code) and shaping terms.

The recipe (docs/recipe.md section 4) and every departure from upstream are documented in the
module of each part: ``math_verifier`` (strict box / math-verify), ``choice_verifier``,
``code_verifier``, ``shaping`` (tool-call shaping, DAPO overlong buffer) and ``registry``
(routing ``data_source`` to a family). ``RewardFunction`` ties them together.
"""

from agentrl.rewards.base import InvalidGroundTruthError, PendingVerdict, RewardResult, Verdict, Verifier
from agentrl.rewards.registry import (
    SourceRule,
    UnknownDataSourceError,
    family_of,
    register_source,
    register_verifier,
    source_rules,
    unregister_source,
)
from agentrl.rewards.reward_function import RewardFunction, leave_out_lost_rewards

__all__ = [
    "InvalidGroundTruthError",
    "PendingVerdict",
    "RewardFunction",
    "leave_out_lost_rewards",
    "RewardResult",
    "SourceRule",
    "UnknownDataSourceError",
    "Verdict",
    "Verifier",
    "family_of",
    "register_source",
    "register_verifier",
    "source_rules",
    "unregister_source",
]
