"""GPU check, part 3: the paper path's memory and collectives (issue 52's fixes), about a minute
(benchmarks/gpu_check.sh caps it at 80 s).

    python benchmarks/gpu_check_paper_path.py summary.json

a. **ZeRO-3 SFT with uneven trained tokens** (needs no GPU: two CPU ranks under torchrun, gloo,
   real DeepSpeed ZeRO-3 with ``stage3_param_persistence_threshold: 0``): one rank holds no
   trained token, the other four logit chunks' worth. Passes when the step completes and its loss
   equals one process's over the same two conversations.
b. **Export beside an awake hf engine** (CUDA): a ~0.5 B Qwen3 in bf16 on a one-rank ZeRO-2
   engine (its parameters views of one flat buffer), the hf rollout engine sharing the module
   after a generate; the peak extra GPU memory of the trainers' export
   (``agentrl.training.hf_export.save_hf_folder``) beside ``save_pretrained``'s. Passes when the
   export's is at most the largest tensor.
c. **Memory plan** (CUDA): after that engine is built, the free memory ``mem_get_info`` reports
   before and after torch's cache is returned (``agentrl.rollout.memory_plan.free_device_memory``),
   the trainer residency measured beside the one docs/paper-scale.md assumes (bf16 weights, the
   fp32 master shard, 0.6 GiB of CUDA context) and the engine share the plan gives from each.
   Passes when the plan is computed and the emptied cache freed no less than before.

A part that cannot run here (no CUDA for b and c, no DeepSpeed) is recorded ``skipped`` with
the reason, never passed. Exit status: 1 a part failed, else 3 a part was skipped, else 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_EXIT = 3
GIB = 2**30
TRAINED = (0, 30)  # trained targets per rank of part a; logit chunks of CHUNK
CHUNK = 8
LENGTH = 40
CUDA_CONTEXT_GIB = 0.6  # docs/paper-scale.md's assumption


def tiny_lm():
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config).float()


def conversation(rank: int):
    import torch

    generator = torch.Generator().manual_seed(100 + rank)
    input_ids = torch.randint(0, 64, (1, LENGTH), generator=generator)
    loss_mask = torch.zeros(1, LENGTH, dtype=torch.long)
    loss_mask[0, LENGTH - TRAINED[rank] :] = 1
    return input_ids, torch.ones(1, LENGTH, dtype=torch.long), loss_mask


def zero3_rank(out: str) -> None:
    """One torchrun rank of part a."""
    import torch

    from agentrl.sft.trainer import AssistantTokenNll
    from agentrl.training import deepspeed_engine as dse

    ctx = dse.init_distributed(2.0)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": ctx.world_size,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "steps_per_print": 10**9,
    }
    optim = dse.OptimizerSettings(1e-3, (0.9, 0.999), 0.0, "constant", 0, 1)
    engine = dse.build_engine(AssistantTokenNll(tiny_lm(), logit_chunk_tokens=CHUNK), config, optim)
    nll_sum, _ = engine(*conversation(ctx.rank))
    engine.backward(nll_sum * ctx.world_size / sum(TRAINED), scale_wrt_gas=False)
    engine.step()
    loss = torch.tensor([float(nll_sum.detach())], dtype=torch.float64)
    torch.distributed.all_reduce(loss)
    if ctx.is_main:
        Path(out).write_text(json.dumps({"loss": float(loss[0]) / sum(TRAINED)}))
    dse.close_distributed()


def part_zero3_uneven() -> dict[str, Any]:
    from agentrl.sft.trainer import AssistantTokenNll

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "loss.json"
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        env |= {
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": f"{ROOT / 'src'}:{env.get('PYTHONPATH', '')}",
        }
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        done = subprocess.run(
            [*command, __file__, "--zero3-rank", str(out)], env=env, capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            return {"status": f"failed: the two ranks exited {done.returncode}: {done.stderr[-600:]}"}
        distributed = json.loads(out.read_text())["loss"]
    model = AssistantTokenNll(tiny_lm(), logit_chunk_tokens=CHUNK)
    single = sum(float(model(*conversation(rank))[0]) for rank in range(len(TRAINED))) / sum(TRAINED)
    ok = abs(distributed - single) <= 1e-5 * abs(single)
    return {
        "status": "passed" if ok else f"failed: loss {distributed} != one process's {single}",
        "trained_tokens_per_rank": list(TRAINED),
        "logit_chunk_tokens": CHUNK,
        "loss_two_ranks": distributed,
        "loss_one_process": single,
    }


def zero2_trainer(ctx):
    """A ~0.5 B Qwen3 (Qwen3-0.6B's shape, 32K vocabulary) on a one-rank ZeRO-2 bf16 engine."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agentrl.training import deepspeed_engine as dse

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=32768,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16).to(ctx.device)
    ds_config = dse.fill_deepspeed_config(
        dse.load_deepspeed_config(dse.find_deepspeed_config(2), 2),
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        world_size=1,
        grad_clip=1.0,
        dtype=torch.bfloat16,
        hidden_size=config.hidden_size,
    )
    return dse.build_engine(model, ds_config, dse.OptimizerSettings(1e-5, (0.9, 0.999), 0.0, "constant", 0, 1))


def part_memory_plan(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    from agentrl.rollout.memory_plan import colocated_memory_plan, free_device_memory, trainer_growth_bytes

    trainer = state["trainer"]
    parameters = sum(p.numel() for p in trainer.module.parameters())
    raw_free, total = torch.cuda.mem_get_info()
    free, _ = free_device_memory()
    assumed_resident = parameters * 2 + parameters * 4 + CUDA_CONTEXT_GIB * GIB  # bf16 weights, fp32 master (W = 1)
    plans = {}
    for name, free_bytes in (
        ("before_emptying", raw_free),
        ("measured", free),
        ("documented", total - assumed_resident),
    ):
        plans[name] = colocated_memory_plan(
            total_bytes=total,
            free_bytes=int(free_bytes),
            trainer_growth=trainer_growth_bytes(parameters, 1, 2, 2),
            weight_bytes=parameters * 2,
            kv_per_token=2 * 28 * 8 * 128 * 2,
            trajectory_tokens=23_190,
            trajectories_per_rank=128,
        ).gpu_memory_utilization
    return {
        "status": "passed" if free >= raw_free else f"failed: emptying the cache left less free ({free} < {raw_free})",
        "total_gib": round(total / GIB, 2),
        "stale_cache_returned_gib": round((free - raw_free) / GIB, 2),
        "trainer_resident_gib_measured": round((total - free) / GIB, 2),
        "trainer_resident_gib_documented": round(assumed_resident / GIB, 2),
        "engine_share": plans,
    }


def part_export(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    from agentrl.model.build import train_tokenizer
    from agentrl.rollout import SamplingParams
    from agentrl.rollout.hf_engine import HFEngine
    from agentrl.training.hf_export import save_hf_folder

    trainer = state["trainer"]
    policy = trainer.module
    engine = HFEngine(policy, pad_token_id=0, batch_size=8, eos_token_ids=())
    engine.generate([[5, 6, 7, 8]] * 8, SamplingParams(temperature=1.0, max_tokens=64, seed=0))

    tokenizer = train_tokenizer(["0123456789"], 300, "qwen3")  # the folder's; the weights are what is measured
    peaks = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, export in (
            ("streamed", lambda: save_hf_folder(policy, tokenizer, Path(folder) / "streamed")),
            ("save_pretrained", lambda: policy.save_pretrained(Path(folder) / "cloned")),
        ):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            export()
            torch.cuda.synchronize()
            peaks[name] = torch.cuda.max_memory_allocated() - base
    largest = max(p.numel() * p.element_size() for p in policy.parameters())
    ok = peaks["streamed"] <= largest
    return {
        "status": "passed"
        if ok
        else f"failed: the export took {peaks['streamed']} bytes more (largest tensor {largest})",
        "flat_buffers": len({p.untyped_storage().data_ptr() for p in policy.parameters()}),
        "extra_gpu_gib": {k: round(v / GIB, 3) for k, v in peaks.items()},
        "largest_tensor_gib": round(largest / GIB, 3),
    }


def run_part(name: str, part: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        result = part()
    except Exception as exc:  # a part's failure is its result; the other parts still run
        traceback.print_exc()
        result = {"status": f"failed: {type(exc).__name__}: {exc}"}
    print(f"gpu_check_paper_path: part {name}: {json.dumps(result)}", flush=True)
    return result


def main(argv: list[str]) -> int:
    if argv[:1] == ["--zero3-rank"]:
        zero3_rank(argv[1])
        return 0
    summary_path = Path(argv[0]) if argv else Path(os.environ.get("OUT", ".")) / "gpu_check_paper_path.json"
    try:
        import deepspeed  # noqa: F401
        import torch
    except ImportError as exc:
        summary = {part: {"status": f"skipped: {exc}"} for part in ("a", "b", "c")}
    else:
        summary = {"a": run_part("a", part_zero3_uneven)}
        if not torch.cuda.is_available():
            summary |= {part: {"status": "skipped: no CUDA device"} for part in ("b", "c")}
        else:
            from agentrl.training import deepspeed_engine as dse

            state = {"trainer": zero2_trainer(dse.init_distributed(10.0))}
            summary["c"] = run_part("c", lambda: part_memory_plan(state))
            summary["b"] = run_part("b", lambda: part_export(state))
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    statuses = [v["status"] for v in summary.values()]
    return (
        1
        if any(s.startswith("failed") for s in statuses)
        else SKIPPED_EXIT
        if any(s.startswith("skipped") for s in statuses)
        else 0
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
