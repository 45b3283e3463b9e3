"""One GRPO step on the embedded model: where the time goes, arms compared, the trainer's overhead.

    python benchmarks/grpo_step.py --model results/models/sft --train results/filter/rl_train.parquet \
        [--config config.yaml --arm recompute='{"grpo": {"old_logprobs": "recompute"}}' --arm auto='{}' \
         --pairs 5 --batch-prompts 16 --n 8 --threads 1 --plain --json out.json]

The config is the repository's ``config.yaml`` (or ``--config``); each ``--arm NAME=JSON`` overrides
it (``--batch-prompts``/``--n`` override every arm); an arm's top-level ``"threads"`` is not a config
key but that arm's torch threads (the rule's ``threads:``; ``--threads`` for the others). The arms run interleaved, A B A B, ``--pairs``
rounds, each run a fresh build of the parts from the model folder and the same step (the same
prompts and rollout seeds), so the arms differ only in what they override and a change in the
machine's load hits each alike; the report gives per arm the median of every timing and, against
the first arm, the median of the per-round ratios.

Builds the GRPO stage's real parts (DeepSpeed actor, hf rollout engine sharing it, agent loop,
sandbox, reward) in this process and runs one step piece by piece: rollout (generation and
tools), reward, old-log-prob recomputation, the update (mini-batches, token-budget micro-batches,
DeepSpeed steps) and the weight push. Then a plain loop trains a fresh copy of the same model on
the very same samples and micro-batches - Hugging Face forward with full logits, the same
token-mean policy-gradient loss without clipping or statistics, backward, ``torch.optim.AdamW``
once per mini-batch - and both report training tokens/s (prompt + response tokens through
forward and backward). Their ratio is what the trainer's machinery costs (DeepSpeed, chunked
log-probs, entropy and clip statistics, the recomputation pass is excluded from both); ``--plain``
adds it to every run. Figures depend on the machine and its load; the report prints the CPU count
and the load average of every run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
TIMINGS = ("step_s", "generate_s", "tools_s", "reward_s", "old_logp_s", "update_s", "weight_sync_s")


def plain_update(model, samples, plan, pad_token_id: int, lr: float, temperature: float) -> float:
    """Seconds to train ``model`` on ``samples`` with ``plan`` in plain torch (no DeepSpeed)."""
    from agentrl.grpo.batching import collate

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    started = time.perf_counter()
    for mini in plan:
        tokens = sum(samples[i].num_loss_tokens for i in mini.members)
        for micro in mini.micro_batches:
            if not micro:
                continue
            batch = collate([samples[i] for i in micro], pad_token_id)
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits / temperature
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
            # Response-frame gather of the (B, L-1) log-probs: column k of row i is position start_i - 1 + k.
            width = batch.loss_mask.shape[1]
            index = (batch.response_start[:, None] - 1 + torch.arange(width)[None]).clamp(max=logp.shape[1] - 1)
            logp = logp.gather(1, index)
            loss = -(logp * batch.advantages * batch.loss_mask).sum() / max(tokens, 1)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return time.perf_counter() - started


def merged(base: dict, overrides: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def one_step(raw: dict, model: Path, train: Path, plain: bool) -> dict:
    """Build the GRPO parts from ``model`` under config ``raw`` and time one step piece by piece."""
    from agentrl.config import load_config
    from agentrl.data.records import read_problems
    from agentrl.grpo.prompts import PromptSampler
    from agentrl.grpo.step import GrpoStep
    from agentrl.grpo.trainer import GrpoPaths, build_components
    from agentrl.tools.factory import make_sandbox
    from agentrl.training import deepspeed_engine as dse
    from agentrl.training.model import load_causal_lm

    cfg = load_config(raw)
    ctx = dse.init_distributed()
    paths = GrpoPaths(model, train, (), Path("-"), Path("-"), Path("-"), dse.find_deepspeed_config(0))
    sampler = PromptSampler(read_problems(train), seed=0)
    with make_sandbox(cfg.sandbox) as sandbox:
        parts, _ = build_components(cfg, paths, ctx, sandbox, steps=1)
        step = GrpoStep(parts)
        t0 = time.perf_counter()
        groups, timing = step.collect(1, sampler)
        advantages = step.advantages(groups)
        samples = step.samples(groups, advantages)
        plan = step.plan(len(groups), samples)
        t1 = time.perf_counter()
        step.recompute_logprobs(samples, plan)
        t2 = time.perf_counter()
        step.update(samples, plan)
        t3 = time.perf_counter()
        parts.rollout_engine.update_weights(parts.engine.module.model.named_parameters())
        t4 = time.perf_counter()

    input_tokens = sum(len(s.input_ids) for s in samples) * cfg.grpo.ppo_epochs
    report = {
        "load_average": os.getloadavg()[0],
        "old_logprobs": parts.old_logprobs,
        "prompts_x_n": f"{cfg.grpo.batch_prompts} x {cfg.grpo.n}",
        "trajectories": len(samples),
        "input_tokens": input_tokens,
        "loss_tokens": sum(s.num_loss_tokens for s in samples),
        "micro_batches": sum(len(m.micro_batches) for m in plan),
        "optimizer_steps": len(plan) * cfg.grpo.ppo_epochs,
        "step_s": t4 - t0,
        "rollout_s": timing["timing/rollout_s"],
        "generate_s": timing["timing/generate_s"],
        "tools_s": timing["timing/tools_s"],
        "reward_s": timing["timing/reward_s"],
        "old_logp_s": t2 - t1,
        "update_s": t3 - t2,
        "weight_sync_s": t4 - t3,
        "trainer_train_tokens_per_s": input_tokens / (t3 - t2),
    }
    if plain:
        lm = load_causal_lm(model, device=torch.device("cpu"))
        plain_s = plain_update(lm, samples, plan, parts.pad_token_id, cfg.grpo.lr, cfg.rollout.temperature)
        report["plain_train_tokens_per_s"] = input_tokens / plain_s
        report["trainer_overhead"] = report["plain_train_tokens_per_s"] / report["trainer_train_tokens_per_s"] - 1.0
    return report


def parse_arm(text: str) -> tuple[str, dict]:
    name, _, raw = text.partition("=")
    if not name or not raw:
        raise argparse.ArgumentTypeError(f"--arm takes NAME=JSON (config keys), got {text!r}")
    return name, json.loads(raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("results/models/sft"))
    parser.add_argument("--train", type=Path, default=Path("results/filter/rl_train.parquet"))
    parser.add_argument(
        "--config", type=Path, default=REPO / "config.yaml", help="the base config (default: the repo's)"
    )
    parser.add_argument("--arm", type=parse_arm, action="append", help="NAME=JSON of config keys over the config")
    parser.add_argument("--pairs", type=int, default=5, help="rounds of every arm in turn")
    parser.add_argument("--batch-prompts", type=int, default=None, help="grpo.batch_prompts of every arm")
    parser.add_argument("--n", type=int, default=None, help="grpo.n of every arm")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--plain", action="store_true", help="also time a plain-torch update of the same samples")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    default_threads = args.threads or torch.get_num_threads()
    base = yaml.safe_load(args.config.read_text()) or {}
    sizes = {k: v for k, v in (("batch_prompts", args.batch_prompts), ("n", args.n)) if v is not None}
    if "batch_prompts" in sizes:  # at most the batch: as many updates per step as the config allows
        mini = base.get("grpo", {}).get("mini_batch_prompts", 8)
        sizes["mini_batch_prompts"] = min(sizes["batch_prompts"], mini)
    arms = dict(args.arm or [("config", {})])
    threads = {name: over.pop("threads", default_threads) for name, over in arms.items()}
    configs = {name: merged(merged(base, over), {"grpo": sizes}) for name, over in arms.items()}
    print(json.dumps({"cpus": os.cpu_count(), "load_average": os.getloadavg(), "config": str(args.config)}))
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    for round_ in range(args.pairs):
        for name in arms:
            torch.set_num_threads(threads[name])
            report = {"threads": threads[name], **one_step(configs[name], args.model, args.train, args.plain)}
            runs[name].append(report)
            print(json.dumps({"round": round_, "arm": name, **report}), flush=True)
    first = next(iter(arms))
    summary = {}
    for name, reports in runs.items():
        keys = [k for k, v in reports[0].items() if isinstance(v, float)]
        summary[name] = {
            "median": {k: statistics.median(r[k] for r in reports) for k in keys},
            f"ratio_to_{first}": {
                k: statistics.median(r[k] / max(f[k], 1e-9) for r, f in zip(reports, runs[first])) for k in TIMINGS
            },
        }
        print(json.dumps({"arm": name, **summary[name]}))
    print(json.dumps({"load_average_end": os.getloadavg()}))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
