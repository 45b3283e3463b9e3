"""The paper's GRPO variants as named sets of algorithm settings (docs/recipe.md section 5).

``grpo.variant`` picks one entry of :data:`VARIANTS`; each non-null key under ``grpo.algorithm``
overrides one setting of it (:func:`resolve_algorithm`). The ablation presets
(``presets/ablations/*.yaml``) only set ``grpo.variant``.

- ``grpo``: vanilla GRPO as DeepSeekMath wrote it (arXiv 2402.03300): per-sequence token mean
  then mean over sequences, symmetric clip 0.2, KL to the reference (k3) with beta 0.04, no dual
  clip, no overlong shaping.
- ``grpo_t``: the paper's baseline "GRPO-T": token-level loss (token mean over the mini-batch),
  symmetric clip 0.2, KL to the reference model. The paper names no coefficient; 0.001 with
  the k3 ("low_var_kl") estimator is verl's default, which the authors' fork keeps.
- ``grpo_scr``: "GRPO-SCR": sequence-level importance ratio as GSPO (arXiv 2507.18071), with
  GSPO's clip range 3e-4 / 4e-4 (the "C", clip-higher, at sequence scale), GSPO's
  per-sequence mean aggregation, no dual clip (pure GSPO) and overlong shaping ("R").
- ``grpo_tcr``: the recipe and the upstream script: token-mean ("T"), clip [1 - 0.2, 1 + 0.28]
  ("C"), dual clip 10, overlong shaping ("R"), no KL, no entropy bonus.
- ``grpo_tcr_paper``: ``grpo_tcr`` with eps_high 0.315, the value the paper reports for
  DemyAgent-4B (the released script uses 0.28).

Every variant keeps the advantage ``(r - mean) / (std + 1e-6)`` of the recipe and entropy
coefficient 0. Overlong shaping says whether GRPO adds ``reward.overlong``'s penalty, which
``reward.overlong.enable`` switches for every stage: GRPO shapes when both say so
(:func:`grpo_reward_config`), so ``enable: false`` turns the penalty off in training too (the
config refuses it beside an explicit ``grpo.algorithm.overlong_shaping: true``). The lengths and
factor stay those of ``reward.overlong``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agentrl.config import ConfigError, GrpoConfig, RewardConfig
from agentrl.grpo.algorithm import KL_ESTIMATORS, LOSS_AGGREGATIONS


@dataclass(frozen=True)
class AlgorithmSettings:
    """Everything that distinguishes the variants; the trainer reads only this."""

    loss_agg_mode: str  # a key of algorithm.LOSS_AGGREGATIONS
    ratio_level: str  # token | sequence
    clip_low: float
    clip_high: float
    clip_c: float | None  # dual clip for A < 0; None = off
    kl_coef: float  # 0 = no reference model
    kl_estimator: str  # a key of algorithm.KL_ESTIMATORS
    entropy_coef: float
    overlong_shaping: bool
    norm_adv_by_std: bool

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0


_TCR = AlgorithmSettings(
    loss_agg_mode="token-mean",
    ratio_level="token",
    clip_low=0.2,
    clip_high=0.28,
    clip_c=10.0,
    kl_coef=0.0,
    kl_estimator="k3",
    entropy_coef=0.0,
    overlong_shaping=True,
    norm_adv_by_std=True,
)

VARIANTS: dict[str, AlgorithmSettings] = {
    "grpo": dataclasses.replace(
        _TCR, loss_agg_mode="seq-mean-token-mean", clip_high=0.2, clip_c=None, kl_coef=0.04, overlong_shaping=False
    ),
    "grpo_t": dataclasses.replace(_TCR, clip_high=0.2, kl_coef=0.001, overlong_shaping=False),
    "grpo_scr": dataclasses.replace(
        _TCR, loss_agg_mode="seq-mean-token-mean", ratio_level="sequence", clip_low=3e-4, clip_high=4e-4, clip_c=None
    ),
    "grpo_tcr": _TCR,
    "grpo_tcr_paper": dataclasses.replace(_TCR, clip_high=0.315),
}


def resolve_algorithm(cfg: GrpoConfig) -> AlgorithmSettings:
    """The variant ``cfg.variant`` with every non-null ``cfg.algorithm`` key applied over it.

    ``algorithm.clip_c: 0`` turns the dual clip off. Raises ConfigError naming the key for a
    value the schema cannot refuse on its own.
    """
    if cfg.variant not in VARIANTS:
        raise ConfigError(f"grpo.variant = {cfg.variant!r} is not known; choose one of {sorted(VARIANTS)}")
    overrides = {k: v for k, v in dataclasses.asdict(cfg.algorithm).items() if v is not None}
    if overrides.get("clip_c") == 0:
        overrides["clip_c"] = None
    unknown = set(overrides) - {f.name for f in dataclasses.fields(AlgorithmSettings)}
    assert not unknown, f"grpo.algorithm keys without a setting: {sorted(unknown)}"
    settings = dataclasses.replace(VARIANTS[cfg.variant], **overrides)
    if settings.clip_c is not None and settings.clip_c <= 1.0:
        raise ConfigError(
            f"grpo.algorithm.clip_c = {settings.clip_c} must exceed 1 (or be 0 to turn the dual clip off)"
        )
    if settings.loss_agg_mode not in LOSS_AGGREGATIONS:
        raise ConfigError(
            f"grpo.algorithm.loss_agg_mode = {settings.loss_agg_mode!r}; choose one of {sorted(LOSS_AGGREGATIONS)}"
        )
    if settings.kl_estimator not in KL_ESTIMATORS:
        raise ConfigError(
            f"grpo.algorithm.kl_estimator = {settings.kl_estimator!r}; choose one of {sorted(KL_ESTIMATORS)}"
        )
    return settings


def grpo_reward_config(reward: RewardConfig, settings: AlgorithmSettings) -> RewardConfig:
    """The reward section GRPO grades with: ``reward`` with the overlong penalty on only where
    both switches are, ``enable = reward.overlong.enable and settings.overlong_shaping``."""
    enable = reward.overlong.enable and settings.overlong_shaping
    return dataclasses.replace(reward, overlong=dataclasses.replace(reward.overlong, enable=enable))
