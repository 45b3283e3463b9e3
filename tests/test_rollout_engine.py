"""The ``hf`` engine: exact sampling log-probs, left padding, stop tokens, caps, seeds, weight updates."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.rollout import random_policy
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.config import load_config
from agentrl.rollout import SamplingParams, make_engine
from agentrl.rollout.hf_engine import HFEngine, filter_logits, sample_tokens

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def policy():
    model_dir = random_policy()
    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def _prompts(tokenizer) -> list[list[int]]:
    texts = ["Compute 12 + 30.", "Hi", "Use the code tool, then answer in \\boxed{}. What is 7 * 8?", "print(1)"]
    return [tokenizer.encode(t) for t in texts]


def _recomputed_logprobs(model, prompt, output, params: SamplingParams) -> torch.Tensor:
    """Teacher-forced log-probs of ``output`` after ``prompt`` under the distribution ``params`` sample from."""
    ids = torch.tensor([list(prompt) + list(output)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    if params.temperature > 0:
        logits = filter_logits(logits / params.temperature, params.top_k, params.top_p)
    return logits.log_softmax(-1).gather(-1, torch.tensor(output)[:, None])[:, 0]


def test_filter_logits_keeps_top_k_and_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    assert torch.isfinite(filter_logits(logits, 2, 1.0)).tolist() == [[True, True, False, False, False]]
    # Mass above token i: 0, .5, .7, .85, .95 -> top_p .8 keeps the first three (.5+.2+.15 >= .8).
    assert torch.isfinite(filter_logits(logits, -1, 0.8)).tolist() == [[True, True, True, False, False]]
    assert torch.isfinite(filter_logits(logits, -1, 0.01)).tolist() == [[True, False, False, False, False]]
    shuffled = logits[:, [3, 0, 4, 2, 1]]  # the filter works on values, not positions
    assert torch.isfinite(filter_logits(shuffled, 2, 1.0)).tolist() == [[False, True, False, False, True]]


def test_sample_tokens_reports_the_logprob_of_the_sampled_distribution():
    torch.manual_seed(0)
    logits = torch.randn(64, 50)
    params = SamplingParams(temperature=0.7, top_k=10, top_p=0.9)
    tokens, logprobs = sample_tokens(
        logits, params, torch.rand(64, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    )
    expected = filter_logits(logits / 0.7, 10, 0.9).log_softmax(-1).gather(-1, tokens[:, None])[:, 0]
    assert torch.allclose(logprobs, expected)
    assert torch.isfinite(logprobs).all(), "a token outside top-k/top-p was sampled"
    greedy_tokens, greedy_logprobs = sample_tokens(logits, SamplingParams(temperature=0), None)
    assert torch.equal(greedy_tokens, logits.argmax(-1))
    assert torch.allclose(greedy_logprobs, logits.log_softmax(-1).max(-1).values)


def test_batched_greedy_equals_one_by_one_and_logprobs_are_exact(policy):
    model, tokenizer = policy
    prompts = _prompts(tokenizer)
    params = SamplingParams(temperature=0, max_tokens=12)
    batched = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=3).generate(prompts, params)
    single = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=1)
    for prompt, output in zip(prompts, batched):
        alone = single.generate([prompt], params)[0]
        assert output.token_ids == alone.token_ids, "left padding changed a greedy continuation"
        assert output.finish_reason == "length" and len(output.token_ids) == 12
        recomputed = _recomputed_logprobs(model, prompt, output.token_ids, params)
        assert torch.allclose(torch.tensor(output.logprobs), recomputed, atol=1e-4)


def test_sampled_logprobs_match_a_teacher_forced_recomputation(policy):
    model, tokenizer = policy
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_tokens=16, seed=3)
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=4)
    prompts = _prompts(tokenizer)
    for prompt, output in zip(prompts, engine.generate(prompts, params)):
        recomputed = _recomputed_logprobs(model, prompt, output.token_ids, params)
        assert torch.allclose(torch.tensor(output.logprobs), recomputed, atol=1e-4)
        assert all(math.isfinite(x) and x <= 0 for x in output.logprobs)


def test_each_sequence_stops_on_its_own_stop_token(policy):
    model, tokenizer = policy
    prompts = _prompts(tokenizer)
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=8)
    free = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=20))
    stop = free[0].token_ids[4]  # a token that prompt 0 reaches at its 5th step
    stopped = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=20, stop_token_ids=(stop,)))
    for before, after in zip(free, stopped):
        if stop in before.token_ids:
            cut = before.token_ids.index(stop) + 1
            assert after.token_ids == before.token_ids[:cut] and after.finish_reason == "stop"
        else:  # rows that never stop are unaffected by the others leaving the batch
            assert after.token_ids == before.token_ids and after.finish_reason == "length"
    assert stopped[0].finish_reason == "stop" and len(stopped[0].token_ids) <= 5


def test_per_prompt_caps_and_seeds(policy):
    model, tokenizer = policy
    prompts = _prompts(tokenizer)
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=8)
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=7)
    capped = engine.generate(prompts, params, max_tokens=[1, 5, 10, 30])
    assert [len(o.token_ids) for o in capped] == [1, 5, 10, 10]
    assert all(o.finish_reason == "length" for o in capped)
    again = engine.generate(prompts, params, max_tokens=[1, 5, 10, 30])
    assert [o.token_ids for o in again] == [o.token_ids for o in capped], "the same seed must sample the same"
    other = engine.generate(prompts, params.replace(seed=8))
    assert [o.token_ids for o in other] != [o.token_ids for o in capped]


def test_update_weights_loads_new_parameters_and_rejects_unknown_names(policy):
    model, tokenizer = policy
    prompts = _prompts(tokenizer)
    params = SamplingParams(temperature=0, max_tokens=8)
    trainer_model = AutoModelForCausalLM.from_pretrained(random_policy())
    with torch.no_grad():
        for parameter in trainer_model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    target = HFEngine(trainer_model, pad_token_id=tokenizer.pad_token_id).generate(prompts, params)
    rollout_model = AutoModelForCausalLM.from_pretrained(random_policy())
    engine = HFEngine(rollout_model, pad_token_id=tokenizer.pad_token_id)
    assert [o.token_ids for o in engine.generate(prompts, params)] != [o.token_ids for o in target]
    engine.update_weights(trainer_model.named_parameters())
    assert [o.token_ids for o in engine.generate(prompts, params)] == [o.token_ids for o in target]
    with pytest.raises(KeyError, match="not_a_parameter"):
        engine.update_weights([("not_a_parameter", torch.zeros(1))])


def test_make_engine_shares_the_trainers_module(policy):
    model, tokenizer = policy
    cfg = load_config({"rollout": {"engine": "hf", "batch_size": 2}}).rollout
    engine = make_engine(cfg, str(random_policy()), model=model, tokenizer=tokenizer)
    assert engine.model is model and engine.batch_size == 2
    engine.update_weights(model.named_parameters())  # its own tensors: nothing to copy, no error
    loaded = make_engine(cfg, str(random_policy()))
    assert loaded.model is not model
    params = SamplingParams(temperature=0, max_tokens=6)
    assert [o.token_ids for o in loaded.generate(_prompts(tokenizer), params)] == [
        o.token_ids for o in engine.generate(_prompts(tokenizer), params)
    ]


def test_sampling_params_validate_and_come_from_the_config():
    cfg = load_config({"rollout": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_response_tokens": 300}})
    params = SamplingParams.from_config(cfg.rollout, seed=5)
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens, params.seed) == (0.6, 0.95, 20, 300, 5)
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_k": 0}, {"max_tokens": 0}):
        with pytest.raises(AssertionError):
            SamplingParams(**bad)
