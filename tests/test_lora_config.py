"""The ``sft.lora`` and ``grpo.lora`` config sections: off by default and in the paper presets, a
bad value refused by the schema naming its key, and the combinations LoRA does not support
refused at load (the workflow's check and the stages') with the reason."""

from __future__ import annotations

import pytest
from helpers.presets import resolved

from agentrl.config import ConfigError, cross_key_problems, load_config


def test_lora_is_off_by_default_and_in_the_paper_presets():
    default = load_config({})
    assert not default.sft.lora.enabled and not default.grpo.lora.enabled
    assert default.grpo.lora.target_modules == ("all-linear",)
    for preset in (("paper-qwen3-4b.yaml",), ("paper-qwen3-4b.yaml", "paper-qwen2.5-7b.yaml")):
        paper = resolved(*preset)
        assert not paper.sft.lora.enabled and not paper.grpo.lora.enabled, preset


@pytest.mark.parametrize(
    ("section", "lora", "message"),
    [
        ("grpo", {"rank": 0}, "'grpo.lora.rank': 0 is less than the minimum of 1"),
        ("sft", {"alpha": 0}, "'sft.lora.alpha': 0 is less than or equal to the minimum of 0"),
        ("sft", {"dropout": 1.0}, "'sft.lora.dropout': 1.0 is greater than or equal to the maximum of 1"),
        ("grpo", {"target_modules": []}, "'grpo.lora.target_modules': [] should be non-empty"),
        ("grpo", {"ranks": 4}, "unknown key(s) ['ranks'] under 'grpo.lora'"),
    ],
)
def test_the_schema_refuses_a_bad_lora_value_naming_the_key(section, lora, message):
    with pytest.raises(ConfigError) as err:
        load_config({section: {"lora": lora}})
    assert message in str(err.value)


def test_unsupported_combinations_are_refused_at_load_with_the_reason():
    def problems(**sections) -> list[str]:
        return [p for p in cross_key_problems(load_config(sections)) if ".lora" in p]

    assert problems(sft={"lora": {"enabled": True}}, grpo={"lora": {"enabled": True}}) == []
    zero3 = problems(sft={"lora": {"enabled": True}, "deepspeed": {"zero_stage": 3}})
    assert len(zero3) == 1 and "sft.lora.enabled with sft.deepspeed.zero_stage = 3" in zero3[0]
    assert "use zero_stage 2 (or 0)" in zero3[0]
    grpo3 = problems(grpo={"lora": {"enabled": True}, "deepspeed": {"zero_stage": 3}, "placement": "separate"})
    assert len(grpo3) == 1 and grpo3[0].startswith("grpo.lora.enabled with grpo.deepspeed.zero_stage = 3")
    dropout = problems(grpo={"lora": {"enabled": True, "dropout": 0.1}})
    assert len(dropout) == 1 and "set grpo.lora.dropout: 0" in dropout[0]
    assert problems(sft={"lora": {"enabled": True, "dropout": 0.1}}) == [], "SFT's loss has no ratio"
    mixed = problems(grpo={"lora": {"target_modules": ["all-linear", "q_proj"]}})
    assert len(mixed) == 1 and "give all-linear alone" in mixed[0]


def test_the_embedded_lora_preset_trains_adapters_and_the_sft_embedding_at_its_measured_rates_and_pretrains_fully():
    from agentrl.sft.pretrain import pretrain_sft_config

    default, lora = load_config({}), resolved("lora.yaml")
    assert lora.sft.lora.enabled and lora.grpo.lora.enabled and lora.results_dir != default.results_dir
    assert (lora.sft.lora.rank, lora.grpo.lora.rank) == (32, 8)
    assert lora.sft.lora.modules_to_save == ("embed_tokens",) and lora.grpo.lora.modules_to_save == ()
    # docs/results.md: GRPO at 10x; SFT at 1e-2, between the 1x that lags and the 10x that stalls
    assert lora.sft.lr == pytest.approx(1e-2) and lora.grpo.lr == pytest.approx(10 * default.grpo.lr)
    assert not cross_key_problems(lora)
    assert not pretrain_sft_config(lora.model.embedded.pretrain, lora.sft).lora.enabled
