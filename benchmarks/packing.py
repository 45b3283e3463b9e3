"""Packed (padding-free) against padded micro-batches: GRPO's update, or an SFT step, A/B.

    python benchmarks/packing.py [--stage grpo|sft] [--arms packed padded shared] [--pairs 5]
        [--prompts 4 --n 8 --prompt-tokens 40 160 --median 500 --max 1440 --budget 2048]
        [--threads 1 --json out.json]
    python benchmarks/packing.py --shapes short embedded --arms packed shared padded --pairs 4

``--shapes`` runs named lengths (:data:`SHAPES`) in place of the length options, side by side:
each round runs every shape's arms in that round's order, and the report gives each shape's
ratios of the first arm to the others.

Samples: ``--prompts`` groups of ``--n`` samples sharing a prompt of uniform length in
``--prompt-tokens``; response lengths lognormal with median ``--median`` and ``P(L > --max) = 2%``
(those cut at ``--max``, the response budget: the long tail of agentic trajectories). The
defaults are the paper's trajectories (median ~8K tokens, at most 2,560 + 20,480, GRPO budget
32,768 per GPU) divided by 16 for a CPU, one rank's mini-batch (16 prompts x 16 / 8 GPUs is 32
samples). ``--stage sft`` uses the same lengths as conversations (each a global batch member,
the second half of each one trained).

GRPO arm: the trainer's own parts on real DeepSpeed (ZeRO-0, ``--dtype``: auto is fp32 on CPU and
bf16 on CUDA, where packed rows take torch's varlen flash kernel): the recomputation
pass (the actor's no-grad forward over every micro-batch) and :meth:`GrpoStep.update` over one
mini-batch (one optimizer step). SFT arm: ``sft.trainer._run_step`` (one optimizer step).
``packed`` sets ``packing: true``, ``padded`` false, ``shared`` (GRPO) ``share_prompts: true``.
The model has the embedded default's shape (config.yaml ``model.embedded``), randomly
initialised. Every (round, shape, arm) runs in a fresh child process, arms alternated A B B A, so each
arm's peak memory is its own: the peak of the heap in use during the timed part less the heap in
use at its start (:class:`HeapWatch`; on CUDA ``max_memory_allocated`` less what is allocated). Wall and CPU seconds are both reported (CPU seconds of one
thread are less sensitive to a shared machine's load). The report gives each arm's
median time and memory, the medians of the per-round ratios to the first arm, and the load
average beside them.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
# --shapes: lengths where the update's layouts were compared (docs/results.md), 8 prompts x 8 samples
SHAPES = {
    # one turn, the prompts most of the tokens (~40-token prompts, ~30-token responses): where
    # share_prompts computes the fewest tokens
    "short": {"prompts": 8, "n": 8, "prompt_tokens": (36, 44), "median": 30, "max": 64, "budget": 16384},
    # the embedded default's GRPO lengths: prompts 150-280, responses median 120 cut at 512
    "embedded": {"prompts": 8, "n": 8, "prompt_tokens": (150, 280), "median": 120, "max": 512, "budget": 16384},
}


def lengths(args, generator: torch.Generator) -> list[tuple[int, list[int]]]:
    """(prompt length, response lengths) per group: uniform prompts, lognormal responses cut at --max."""
    sigma = math.log(args.max / args.median) / 2.054  # P(L > max) = 2%: z = 2.054
    groups = []
    for _ in range(args.prompts):
        low, high = args.prompt_tokens
        prompt = int(torch.randint(low, high + 1, (1,), generator=generator))
        normal = torch.randn(args.n, generator=generator, dtype=torch.float64)
        responses = [max(1, min(args.max, round(args.median * math.exp(sigma * float(z))))) for z in normal]
        groups.append((prompt, responses))
    return groups


def model_config(max_length: int):
    from transformers import Qwen3Config

    shape = yaml.safe_load((REPO / "config.yaml").read_text())["model"]["embedded"]
    return Qwen3Config(
        vocab_size=shape["vocab_size"],
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"],
        num_key_value_heads=shape["num_kv_heads"],
        head_dim=shape["head_dim"],
        max_position_embeddings=max(max_length, shape["max_position_embeddings"]),
        tie_word_embeddings=True,
    )


class HeapWatch:
    """The peak of glibc's in-use heap bytes (``mallinfo2``: small blocks + mmapped ones, where
    torch's CPU tensors live), polled every millisecond by a thread (torch's ops release the GIL)."""

    def __init__(self) -> None:
        class MallInfo2(ctypes.Structure):
            names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
            _fields_ = [(name, ctypes.c_size_t) for name in names.split()]

        self._mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
        self._mallinfo2.restype = MallInfo2
        self.start = self.peak = self.in_use()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def in_use(self) -> int:
        info = self._mallinfo2()
        return info.uordblks + info.hblkhd

    def _poll(self) -> None:
        while not self._done.wait(0.001):
            self.peak = max(self.peak, self.in_use())

    def growth(self) -> int:
        self._done.set()
        self._thread.join()
        return max(self.peak, self.in_use()) - self.start


def start_clock(device) -> tuple[float, float, HeapWatch | None]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return time.perf_counter(), time.process_time(), None
    return time.perf_counter(), time.process_time(), HeapWatch()


def stop_clock(device, started: tuple[float, float, HeapWatch | None]) -> dict:
    """Wall and CPU seconds since ``started``, and the growth of the peak memory over its start."""
    wall, cpu, heap = started
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        growth = torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device)
    else:
        growth = heap.growth()
    return {
        "seconds": time.perf_counter() - wall,
        "cpu_seconds": time.process_time() - cpu,
        "peak_growth_bytes": growth,
    }


def grpo_child(args, arm: str, groups, ctx, model) -> dict:
    """The recomputation pass and one optimizer step of GRPO's update: seconds and peak memory."""
    from agentrl.config import load_config
    from agentrl.grpo.batching import PolicySample
    from agentrl.grpo.policy import ResponseLogProbs
    from agentrl.grpo.step import Components, GrpoStep
    from agentrl.grpo.trainer import GrpoPaths, build_engine
    from agentrl.grpo.variants import resolve_algorithm
    from agentrl.training import deepspeed_engine as dse

    overrides = {"packed": {"packing": True}, "padded": {"packing": False}, "shared": {"share_prompts": True}}[arm]
    raw = {"share_prompts": False, **overrides, "deepspeed": {"zero_stage": 0, "dtype": args.dtype}}
    raw.update(n=args.n, batch_prompts=args.prompts, mini_batch_prompts=args.prompts, micro_batch_tokens=args.budget)
    cfg = load_config({"grpo": raw})
    paths = GrpoPaths(*[Path("-")] * 2, (), *[Path("-")] * 3, dse.find_deepspeed_config(0))
    actor = ResponseLogProbs(model, logit_chunk_tokens=cfg.grpo.logit_chunk_tokens, temperature=1.0)
    engine = build_engine(actor, cfg, paths, ctx, args.torch_dtype, steps=1)
    parts = Components(cfg, resolve_algorithm(cfg.grpo), ctx, engine, None, None, None, None, pad_token_id=0)
    step = GrpoStep(parts)
    generator = torch.Generator().manual_seed(args.seed + 1)
    samples = []
    for prompt_length, responses in groups:
        prompt = torch.randint(5, model.config.vocab_size, (prompt_length,), generator=generator).tolist()
        for length in responses:
            response = torch.randint(5, model.config.vocab_size, (length,), generator=generator).tolist()
            advantage = float(torch.randn(1, generator=generator))
            samples.append(PolicySample(prompt + response, prompt_length, [1] * length, [0.0] * length, advantage))
    plan = step.plan(len(groups), samples)
    started = start_clock(ctx.device)
    with torch.no_grad():  # the recomputation pass (GrpoStep.recompute_logprobs skips it for one mini-batch)
        engine.module.eval()
        for micro in (mb for mini in plan for mb in mini.micro_batches if mb):
            old_logp, _ = engine.module(step.micro_batch(samples, micro))
        engine.module.train()
    step.update(samples, plan)
    return stop_clock(ctx.device, started)


def sft_child(args, arm: str, groups, ctx, model) -> dict:
    """One SFT optimizer step over the conversations: seconds and peak memory."""
    from agentrl.config import load_config
    from agentrl.sft.batching import TokenizedExample
    from agentrl.sft.trainer import AssistantTokenNll, _run_step
    from agentrl.training import deepspeed_engine as dse

    conversations = [p + r for p, responses in groups for r in responses]
    cfg = load_config(
        {
            "sft": {
                "packing": arm == "packed",
                "global_batch_size": len(conversations),
                "micro_batch_size": len(conversations),
                "micro_batch_tokens": args.budget,
                "deepspeed": {"zero_stage": 0, "dtype": args.dtype},
            }
        }
    ).sft
    engine = dse.build_stage_engine(
        AssistantTokenNll(model),
        cfg,
        dse.find_deepspeed_config(0),
        ctx,
        args.torch_dtype,
        hidden_size=model.config.hidden_size,
        micro_batch_size=len(conversations),
        accumulation=1,
        warmup_steps=0,
        total_steps=1,
    )
    generator = torch.Generator().manual_seed(args.seed + 1)
    examples = []
    for i, length in enumerate(conversations):
        ids = torch.randint(5, model.config.vocab_size, (length,), generator=generator).tolist()
        examples.append(TokenizedExample(str(i), ids, [0] * (length // 2) + [1] * (length - length // 2)))
    started = start_clock(ctx.device)
    _run_step(engine, examples, list(range(len(examples))), cfg, ctx, 0)
    return stop_clock(ctx.device, started)


def child(args) -> None:
    from transformers import Qwen3ForCausalLM

    from agentrl.training import deepspeed_engine as dse

    torch.set_num_threads(args.threads)
    groups = lengths(args, torch.Generator().manual_seed(args.seed))
    ctx = dse.init_distributed()
    torch.manual_seed(args.seed)
    from agentrl.precision import resolve_dtype

    args.torch_dtype = resolve_dtype(args.dtype, ctx.device)
    model = Qwen3ForCausalLM(model_config(max(p + r for p, rs in groups for r in rs)))
    model = model.to(device=ctx.device, dtype=args.torch_dtype)
    run = grpo_child if args.stage == "grpo" else sft_child
    print(json.dumps(run(args, args.child, groups, ctx, model)))


def with_shape(args, shape: str):
    """``args`` with the lengths of the named ``shape`` (``options``: the command line's own)."""
    if shape == "options":
        return args
    return argparse.Namespace(**{**vars(args), **SHAPES[shape]})


def describe(args) -> dict:
    groups = lengths(args, torch.Generator().manual_seed(args.seed))
    all_lengths = sorted(p + r for p, rs in groups for r in rs)
    prompts = sum(p * len(rs) for p, rs in groups)
    return {
        "samples": len(all_lengths),
        "tokens": sum(all_lengths),
        "prompt_share": round(prompts / sum(all_lengths), 3),
        "median_length": statistics.median(all_lengths),
        "max_length": all_lengths[-1],
    }


def run_child(args, shape: str, arm: str) -> dict:
    command = [sys.executable, __file__, "--child", arm, "--shape", shape] + sys.argv[1:]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{shape} {arm}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(arms: list[str], rounds: list[dict]) -> dict:
    """Each arm's medians, and the medians of the per-round ratios of the first arm to each other."""
    first, summary = arms[0], {}
    for arm in arms:
        summary[arm] = {
            "seconds_median": statistics.median(r[arm]["seconds"] for r in rounds),
            "cpu_seconds_median": statistics.median(r[arm]["cpu_seconds"] for r in rounds),
            "peak_growth_mb_median": statistics.median(r[arm]["peak_growth_bytes"] for r in rounds) / 2**20,
        }
        if arm != first:
            summary[f"{first}/{arm}"] = {
                "time_ratio_median": statistics.median(r[first]["seconds"] / r[arm]["seconds"] for r in rounds),
                "time_ratios": [round(r[first]["seconds"] / r[arm]["seconds"], 3) for r in rounds],
                "cpu_time_ratio_median": statistics.median(
                    r[first]["cpu_seconds"] / r[arm]["cpu_seconds"] for r in rounds
                ),
                "memory_ratio_median": statistics.median(
                    r[first]["peak_growth_bytes"] / max(r[arm]["peak_growth_bytes"], 1) for r in rounds
                ),
            }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=("grpo", "sft"), default="grpo")
    parser.add_argument("--arms", nargs="+", default=["packed", "padded"], choices=("packed", "padded", "shared"))
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), help="named lengths, in place of the options")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, nargs=2, default=(40, 160))
    parser.add_argument("--median", type=int, default=500)
    parser.add_argument("--max", type=int, default=1440)
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto", help="auto: bf16 on CUDA")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--shape", default="options", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(with_shape(args, args.shape))

    shapes = args.shapes or ["options"]
    print(json.dumps({"cpus": os.cpu_count(), "load_average": os.getloadavg()}))
    for shape in shapes:
        print(json.dumps({"shape": shape, **describe(with_shape(args, shape))}))
    rounds = {shape: [] for shape in shapes}
    for index in range(args.pairs):
        order = args.arms if index % 2 == 0 else args.arms[::-1]
        for shape in shapes:
            results = {arm: run_child(args, shape, arm) for arm in order}
            results["load_average"] = os.getloadavg()[0]
            rounds[shape].append(results)
            print(json.dumps({"round": index, "shape": shape, **results}), flush=True)
    if args.shapes is None:  # one shape: the summary as before named shapes
        summary = {
            "command": " ".join(sys.argv),
            "rounds": rounds["options"],
            **summarize(args.arms, rounds["options"]),
        }
        print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=1))
    else:
        summary = {"command": " ".join(sys.argv), "shapes": {}}
        for shape in shapes:
            lengths_info = describe(with_shape(args, shape))
            summary["shapes"][shape] = {**lengths_info, "rounds": rounds[shape], **summarize(args.arms, rounds[shape])}
        print_ratios(args.arms, summary["shapes"])
    print(json.dumps({"load_average_end": os.getloadavg()}))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


def print_ratios(arms: list[str], shapes: dict) -> None:
    """One line per shape and ratio: medians of the per-round ratios, wall and CPU, and memory."""
    first = arms[0]
    for shape, summary in shapes.items():
        for arm in arms[1:]:
            ratio = summary[f"{first}/{arm}"]
            print(
                f"{shape:9s} {first}/{arm}: time {ratio['time_ratio_median']:.3f} wall "
                f"(per round {', '.join(f'{r:.3f}' for r in ratio['time_ratios'])}), "
                f"{ratio['cpu_time_ratio_median']:.3f} CPU; memory {ratio['memory_ratio_median']:.3f}"
            )


if __name__ == "__main__":
    main()
