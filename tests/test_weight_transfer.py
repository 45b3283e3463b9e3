"""How a policy version reaches a rollout engine (agentrl.rollout.weight_transfer): the trainer's
weights over the agentrl_gloo backend into a real hf engine (sender and receiver in one process,
each on its own thread, as the trainer's end drives the client), the init info each placement
gets, vLLM's factories loading the backend's classes by the module path registered for them, and
(vllm tier) the CUDA branch's NCCL init info and vLLM's NCCL trainer reading the trainer's weights
as they are passed to it, with no wrapper."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch
from helpers.rollout import random_policy
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.grpo.rollout_process import TrainerWeights
from agentrl.rollout import SamplingParams
from agentrl.rollout.hf_engine import HFEngine
from agentrl.rollout.weight_transfer import (
    GLOO_BACKEND,
    VLLM_CLASSES,
    GlooWeightReceiver,
    ParamSpec,
    trainer_engine,
    trainer_init_info,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(t) for t in ["Compute 12 + 30.", "Hi", "print(1)"]]


def test_the_trainers_weights_reach_an_hf_engine_over_agentrl_gloo():
    """The hf engine's weight_sync() takes one push of the trainer's weights: afterwards its
    parameters are the trainer's and it generates what the trainer's module generates."""
    model_dir = random_policy()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        for parameter in trainer.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    greedy = SamplingParams(temperature=0, max_tokens=8)
    target = [
        o.token_ids
        for o in HFEngine(trainer, pad_token_id=tokenizer.pad_token_id).generate(_prompts(tokenizer), greedy)
    ]
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(model_dir).eval(), pad_token_id=tokenizer.pad_token_id)
    assert [o.token_ids for o in engine.generate(_prompts(tokenizer), greedy)] != target, "the versions must differ"

    receiver = engine.weight_sync()
    assert isinstance(receiver, GlooWeightReceiver)
    sender = trainer_engine("hf", "cpu", TrainerWeights(trainer), receiver, rank=0, receivers=1, timeout_s=60)
    try:
        sender.send_weights()
    finally:
        sender.shutdown()
    for (name, sent), (_, held) in zip(trainer.named_parameters(), engine.model.named_parameters(), strict=True):
        torch.testing.assert_close(held, sent, rtol=0, atol=0, msg=name)
    assert [o.token_ids for o in engine.generate(_prompts(tokenizer), greedy)] == target


def test_every_placement_but_vllm_on_cuda_gets_the_gloo_init_info():
    """The hf engine (on GPUs too: NCCL connects no two processes on one device) and vLLM on CPU
    take agentrl_gloo; the world is the sender and the engine's workers, rank 0 sends."""
    for engine, device in (("hf", "cpu"), ("hf", "cuda"), ("vllm", "cpu")):
        info = trainer_init_info(engine, device, rank=0, receivers=2, timeout_s=30)
        assert (info.backend, info.world_size, info.timeout_s, info.is_sender) == (GLOO_BACKEND, 3, 30, True)
    assert not trainer_init_info("hf", "cpu", rank=1, receivers=1, timeout_s=30).is_sender


def test_the_module_path_registered_with_vllm_defines_the_classes_it_names():
    """register_gloo_backend names the classes by module path (vLLM imports them when an engine
    asks for the backend, so no module here imports them): the path must stay theirs."""
    spec = importlib.util.find_spec(VLLM_CLASSES)
    assert spec is not None and spec.origin is not None, f"{VLLM_CLASSES} is not a module"
    tree = ast.parse(Path(spec.origin).read_text())
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    assert {"GlooWorkerEngine", "GlooTrainerEngine"} <= classes


@pytest.mark.vllm
def test_the_cuda_branch_gets_vllms_nccl_info_and_vllms_trainer_reads_the_trainers_weights_as_passed():
    """What the CUDA placement runs, short of an NCCL group: the init info vLLM's factory dispatches
    on, and the nccl trainer's own check of a weight source (metadata against iteration) passing on
    :class:`TrainerWeights` as trainer_engine passes it, and failing on a source that disagrees."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

    from agentrl.rollout.weight_transfer import register_gloo_backend

    sender = trainer_init_info("vllm", "cuda", rank=0, receivers=2, timeout_s=30)
    assert (sender.backend, sender.world_size, sender.is_sender) == ("nccl", 3, True) and sender.master_port > 0
    other = trainer_init_info("vllm", "cuda:1", rank=1, receivers=2, timeout_s=30)
    assert (other.master_port, other.is_sender) == (0, False)

    model = AutoModelForCausalLM.from_pretrained(random_policy())
    source = TrainerWeights(model)
    checked = list(NCCLTrainerWeightTransferEngine._checked_iter(source, source.metadata()))
    assert [name for name, _ in checked] == [name for name, _ in model.named_parameters()]
    wrong = [ParamSpec(s.name, torch.float16, s.shape) for s in source.metadata()]
    with pytest.raises(ValueError, match="disagrees with iteration"):
        list(NCCLTrainerWeightTransferEngine._checked_iter(source, wrong))

    register_gloo_backend()
    assert WeightTransferEngineFactory._registry[GLOO_BACKEND]().__name__ == "GlooWorkerEngine"
    assert WeightTransferTrainerFactory._registry[GLOO_BACKEND]().__name__ == "GlooTrainerEngine"
