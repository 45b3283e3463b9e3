"""LoRA on PEFT (``sft.lora``, ``grpo.lora``, agentrl.training.lora), in process on a tiny Qwen3:
the target modules checked against the model folder, the adapters as the stages' forwards see them (packed attention,
GRPO's reference with the adapter off, the hf engine's generation), and the merged weights that
the export and the vLLM pushes read."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.grpo_updates import uneven_samples
from helpers.rollout import random_policy

from agentrl.config import ConfigError, load_config
from agentrl.training.lora import (
    ADAPTER_FOLDER,
    MergedWeights,
    MergedWeightSource,
    check_target_modules,
    hf_weights,
    is_lora,
    linear_layer_names,
    save_merged_folder,
)
from agentrl.training.model import load_causal_lm

VOCAB = 500  # below the random policy's vocabulary
QWEN3_LINEAR = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


@pytest.fixture(scope="module")
def policy_dir():
    return random_policy()


def _lora(**values):
    return load_config({"grpo": {"lora": {"enabled": True, **values}}}).grpo.lora


def _trained(model_dir, seed: int = 0, **lora):
    """The policy with adapters whose B is random (a trained adapter: the update is not zero), and
    any module trained whole (``modules_to_save``) moved off its original."""
    model = load_causal_lm(model_dir, lora=_lora(**lora), seed=seed).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))
            elif ".modules_to_save." in name:
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model


# --------------------------------------------------------------------------- the model folder
def test_a_target_module_the_model_lacks_is_refused_naming_it_and_the_models_linear_layers(policy_dir):
    assert linear_layer_names(policy_dir) == QWEN3_LINEAR  # the output head is not among them
    check_target_modules(policy_dir, _lora(target_modules=["q_proj", "down_proj"]), "grpo.lora")
    check_target_modules(policy_dir, _lora(), "grpo.lora")
    with pytest.raises(ConfigError) as err:
        check_target_modules(policy_dir, _lora(target_modules=["q_proj", "qkv_proj"]), "grpo.lora")
    assert str(err.value) == (
        f"grpo.lora.target_modules: qkv_proj is not a linear layer of {policy_dir}; its linear layers (but the "
        "output head) are down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj, or give all-linear"
    )
    with pytest.raises(ConfigError, match="grpo.lora.target_modules: lm_head is not a linear layer"):
        load_causal_lm(policy_dir, lora=_lora(target_modules=["lm_head"]), lora_key="grpo.lora")


# --------------------------------------------------------------------------- the adapters
def test_only_the_adapters_train_every_linear_layer_of_the_blocks_has_one_and_the_start_is_the_model(policy_dir):
    plain = load_causal_lm(policy_dir).eval()
    model = load_causal_lm(policy_dir, lora=_lora(rank=2), seed=5).eval()
    assert is_lora(model) and not is_lora(plain)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    adapted = {n.split(".lora_A.")[0].rsplit(".", 1)[-1] for n in trainable if ".lora_A." in n}
    assert sorted(adapted) == QWEN3_LINEAR
    layers = plain.config.num_hidden_layers
    assert len(trainable) == 2 * len(QWEN3_LINEAR) * layers
    ids = torch.randint(5, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model(input_ids=ids).logits, plain(input_ids=ids).logits, rtol=0, atol=0)
    # the initial A comes from the seed alone: another global random state, the same adapter
    torch.manual_seed(1234)
    again = load_causal_lm(policy_dir, lora=_lora(rank=2), seed=5)
    for (name, a), (_, b) in zip(model.named_parameters(), again.named_parameters()):
        assert torch.equal(a, b), name


def test_merged_weights_are_pefts_merge_with_the_models_own_names_and_leave_the_module_as_it_was(policy_dir):
    model = _trained(policy_dir)
    plain = load_causal_lm(policy_dir)
    merged = MergedWeights(model)
    assert list(merged) == [name for name, _ in plain.named_parameters()]
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    for name in merged:
        torch.testing.assert_close(merged[name], reference[name], rtol=0, atol=0)
    assert [name for name, _ in hf_weights(model)] == list(merged)
    assert [name for name, _ in hf_weights(plain)] == list(merged)
    source = MergedWeightSource(model)
    specs = source.metadata()
    assert [s.name for s in specs] == list(merged)
    for spec, (name, tensor) in zip(specs, source):
        assert (spec.name, spec.dtype, spec.shape) == (name, tensor.dtype, tuple(tensor.shape))
    # computed on access: the module still holds the base weights and the adapters apart
    assert not any(layer.merged for layer in model.modules() if hasattr(layer, "merged"))
    with model.disable_adapter():
        base = dict(plain.named_parameters())
        assert all(torch.equal(MergedWeights(model)[n], base[n]) for n in merged)


def test_the_merged_folder_loads_as_the_lora_model_and_its_adapter_onto_the_base_model(policy_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _trained(policy_dir)
    save_merged_folder(model, AutoTokenizer.from_pretrained(policy_dir), tmp_path / "out")
    ids = torch.randint(5, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
        assert type(loaded).__name__ == "Qwen3ForCausalLM"
        torch.testing.assert_close(loaded(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)
        base = AutoModelForCausalLM.from_pretrained(policy_dir)
        adapter = PeftModel.from_pretrained(base, tmp_path / "out" / ADAPTER_FOLDER).eval()
        torch.testing.assert_close(adapter(input_ids=ids).logits, expected, rtol=0, atol=0)


def test_grpo_forwards_reach_the_transformer_through_peft_packed_or_padded_and_the_reference_is_the_adapter_off(
    policy_dir,
):
    from agentrl.grpo.batching import collate
    from agentrl.grpo.policy import AdapterDisabled, ResponseLogProbs

    samples = uneven_samples(VOCAB, [(6, [5, 3]), (4, [7, 2])])
    actor = ResponseLogProbs(_trained(policy_dir), logit_chunk_tokens=8, temperature=1.0)
    base = ResponseLogProbs(load_causal_lm(policy_dir).eval(), logit_chunk_tokens=8, temperature=1.0)
    padded, packed = collate(samples, 0), collate(samples, 0, packed=True)
    with torch.no_grad():
        logp, _ = actor(padded)
        torch.testing.assert_close(actor(packed)[0], logp, rtol=1e-5, atol=1e-5)
        # the packed attention was registered on the transformer inside PEFT's wrapper
        assert actor.model.get_base_model().config._attn_implementation.startswith("agentrl_packed")
        reference, _ = AdapterDisabled(actor)(padded)
        torch.testing.assert_close(reference, base(padded)[0], rtol=1e-5, atol=1e-6)
        assert (reference - logp).abs().max() > 1e-3, "the adapter changes the policy"
        torch.testing.assert_close(actor(padded)[0], logp, rtol=0, atol=0)  # and is back on after


def test_the_hf_engine_generates_through_the_peft_module_as_through_its_merged_weights(policy_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.rollout.engine import SamplingParams
    from agentrl.rollout.hf_engine import HFEngine

    model = _trained(policy_dir)
    save_merged_folder(model, AutoTokenizer.from_pretrained(policy_dir), tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    prompts = [[5, 17, 300, 42], [9, 8, 7]]
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=3)
    through_peft = HFEngine(model, pad_token_id=0).generate(prompts, params)
    through_merged = HFEngine(merged, pad_token_id=0).generate(prompts, params)
    for a, b in zip(through_peft, through_merged):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- modules trained whole
def test_a_module_to_save_the_model_lacks_is_refused_naming_the_models_modules(policy_dir):
    check_target_modules(policy_dir, _lora(modules_to_save=["embed_tokens"]), "sft.lora")
    with pytest.raises(ConfigError) as err:
        load_causal_lm(policy_dir, lora=_lora(modules_to_save=["embed_tokenz"]), lora_key="sft.lora")
    message = str(err.value)
    assert message.startswith(f"sft.lora.modules_to_save: embed_tokenz is no module of {policy_dir} with weights")
    assert "embed_tokens" in message and "q_proj" in message, message


def test_a_trained_embedding_is_the_tied_heads_too_merges_under_its_own_name_and_the_adapter_off_is_the_model(
    policy_dir, tmp_path
):
    """modules_to_save [embed_tokens] on a tied model (the embedded model's SFT): the copy trains
    and is the output head too; the merged weights, the exported folder and its adapter are the
    trained model, and the adapter off (GRPO's reference) is the model as it was loaded."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    plain = load_causal_lm(policy_dir).eval()
    assert plain.config.tie_word_embeddings
    fresh = load_causal_lm(policy_dir, lora=_lora(rank=2, modules_to_save=["embed_tokens"]), seed=5).eval()
    trainable = [n for n, p in fresh.named_parameters() if p.requires_grad]
    copies = [n for n in trainable if ".lora_" not in n]
    assert copies == ["base_model.model.model.embed_tokens.modules_to_save.default.weight"], copies
    base = fresh.get_base_model()
    assert base.get_output_embeddings().weight is base.get_input_embeddings().weight, "the head left the embedding"
    ids = torch.randint(5, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(fresh(input_ids=ids).logits, plain(input_ids=ids).logits, rtol=0, atol=0)

    model = _trained(policy_dir, rank=2, modules_to_save=["embed_tokens"])
    merged = MergedWeights(model)
    assert list(merged) == [name for name, _ in plain.named_parameters()]
    embedding = "model.embed_tokens.weight"
    assert not torch.equal(merged[embedding], dict(plain.named_parameters())[embedding]), "the trained copy is read"
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    for name in merged:
        torch.testing.assert_close(merged[name], reference[name], rtol=0, atol=0, msg=name)
    assert [s.name for s in MergedWeightSource(model).metadata()] == list(merged)
    with torch.no_grad(), model.disable_adapter():
        originals = dict(plain.named_parameters())
        assert all(torch.equal(MergedWeights(model)[n], originals[n]) for n in merged)
        torch.testing.assert_close(model(input_ids=ids).logits, plain(input_ids=ids).logits, rtol=0, atol=0)

    save_merged_folder(model, AutoTokenizer.from_pretrained(policy_dir), tmp_path / "out")
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
        torch.testing.assert_close(loaded(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)
        onto_base = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(policy_dir), tmp_path / "out" / ADAPTER_FOLDER
        )
        torch.testing.assert_close(onto_base.eval()(input_ids=ids).logits, expected, rtol=0, atol=0)
