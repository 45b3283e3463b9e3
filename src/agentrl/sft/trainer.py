"""The SFT loop on DeepSpeed (docs/recipe.md section 5).

Recipe: AdamW (betas, weight decay), cosine schedule with linear warmup over ``warmup_ratio`` of
the steps, global-norm clipping, ``epochs`` passes, global batch of ``global_batch_size``
conversations, right truncation at ``max_length``, bf16 on GPU; loss on assistant tokens only.

Deliberate departures from upstream (verl's SFT trainer), with reasons:
- Loss (``sft.loss_weighting: step_tokens``) = summed next-token NLL over the trained tokens of
  the whole optimizer step divided by their count (token mean over the global batch). Upstream
  (``micro_batch_sum``, :func:`micro_batch_loss_scales`) sums the micro-batches' token means over
  a rank and averages over ranks, which weighs a token by the size of the micro-batch it landed in
  and scales the gradient by the micro-batches per rank (which ``grad_clip`` then sees); with
  token-budget micro-batches that weighting would change with packing. With ``step_tokens``
  packing and the number of processes cannot change the gradient (tests/test_sft_distributed.py
  checks 1 vs 2 processes).
- Each prediction weighs by the mask of its target token (``sft.loss_mask_alignment: target``);
  upstream weighs it by the mask of its input token (``input``, :func:`agentrl.sft.batching.aligned_loss_mask`).
- Logits are computed only at trained positions, in chunks with recomputation, so a 32k-token
  conversation over a 152k vocabulary never materialises its full (T, V) logits.
- The last partial global batch of each epoch is dropped (upstream's sampler does the same).

Resume: a checkpoint every ``save_every_steps`` steps; the data order is a pure function of
(seed, epoch, step) and the checkpoint restores model, optimizer, scheduler and RNG states, so a
restarted run continues at the next step and ends with the same model as an uninterrupted one.
The checkpoint also carries the metric records of its steps, from which a resumed run rewrites
the metrics file (the resume rule of :mod:`agentrl.training.metrics`, shared with GRPO).
A checkpoint made by a different run setup (config, data, base model, process count) is refused
and kept: the stage stops naming what differs and the command that starts over.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from agentrl.config import ConfigError, SftConfig, TrackingConfig, lora_section_problems
from agentrl.data.records import read_sft_examples
from agentrl.precision import resolve_dtype
from agentrl.sft.batching import (
    TokenizedExample,
    check_trained_tokens,
    collate,
    collate_packed,
    pack_micro_batches,
    step_indices,
    steps_per_epoch,
    tokenize_examples,
)
from agentrl.training import deepspeed_engine as dse
from agentrl.training.collectives import max_over_ranks
from agentrl.training.fingerprint import fingerprint_of, without_keys
from agentrl.training.loop import TrainingLoop, training_stage
from agentrl.training.lora import check_target_modules
from agentrl.training.model import load_causal_lm
from agentrl.training.packing import PackedRow, enable_packed_attention
from agentrl.training.seeds import derived_seed

log = logging.getLogger("agentrl.sft")

# Positions per chunk of the vocabulary projection: bounds the logits' memory (chunk x vocab floats).
LOGIT_CHUNK_TOKENS = 4096


class AssistantTokenNll(torch.nn.Module):
    """A causal LM returning (summed NLL of the trained next-token targets, their count).

    The vocabulary projection runs in chunks of ``logit_chunk_tokens`` trained targets, and every
    rank runs as many chunks as the rank with the most (:func:`max_over_ranks`): under ZeRO-3 each
    call of the output embedding gathers its parameters, a collective the ranks must issue alike.
    A chunk beyond a rank's targets (all of them on a rank with none) projects one position and
    weighs its NLL 0, which also gives every parameter a gradient, as ZeRO-2/3's reductions need.
    Activation checkpointing of the chunks is decided on the agreed count too, since its backward
    recomputes (calls) the projection again.
    """

    def __init__(self, lm: torch.nn.Module, logit_chunk_tokens: int = LOGIT_CHUNK_TOKENS):
        super().__init__()
        self.lm = lm
        self.logit_chunk_tokens = logit_chunk_tokens

    def _chunk_nll(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm.get_output_embeddings()(hidden).float()  # (n, V)
        return F.cross_entropy(logits, targets, reduction="sum")

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        loss_mask: torch.Tensor,
        packed: PackedRow | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``packed``: the inputs are one packed row (:func:`agentrl.sft.batching.collate_packed`)."""
        if packed is not None:
            enable_packed_attention(self.lm)
            hidden = self.lm.get_decoder()(**packed.model_inputs()).last_hidden_state  # (1, T, H)
        else:
            hidden = self.lm.get_decoder()(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False
            ).last_hidden_state  # (B, T, H)
        trained = loss_mask[:, 1:].bool()  # (B, T-1): is token t+1 a trained target
        hidden_at = hidden[:, :-1][trained]  # (N, H), the positions that predict trained tokens
        targets = input_ids[:, 1:][trained]  # (N,)
        chunks = max_over_ranks(max(1, math.ceil(targets.numel() / self.logit_chunk_tokens)), targets.device)
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, chunks * self.logit_chunk_tokens, self.logit_chunk_tokens):
            chunk = slice(start, start + self.logit_chunk_tokens)
            states, chunk_targets, weight = hidden_at[chunk], targets[chunk], 1.0
            if chunk_targets.numel() == 0:
                states, chunk_targets, weight = hidden[:1, 0], input_ids[:1, 0], 0.0
            if chunks > 1:
                nll = checkpoint(self._chunk_nll, states, chunk_targets, use_reentrant=False)
            else:
                nll = self._chunk_nll(states, chunk_targets)
            total = total + weight * nll
        return total, torch.tensor(targets.numel(), device=targets.device)


@dataclass(frozen=True)
class SftPaths:
    model_dir: Path
    data: Path
    out_dir: Path
    metrics: Path
    checkpoint_dir: Path
    deepspeed_config: Path


@dataclass(frozen=True)
class StepPlan:
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    micro_batch_size: int  # DeepSpeed's bookkeeping triple: micro x accumulation x world = global
    accumulation: int


def plan_steps(cfg: SftConfig, num_examples: int, world_size: int) -> StepPlan:
    if cfg.global_batch_size % world_size:
        raise ConfigError(
            f"sft.global_batch_size={cfg.global_batch_size} must be a multiple of the process count ({world_size})"
        )
    per_epoch = steps_per_epoch(num_examples, cfg.global_batch_size)
    total = per_epoch * cfg.epochs
    per_rank = cfg.global_batch_size // world_size
    micro = max(m for m in range(1, min(cfg.micro_batch_size, per_rank) + 1) if per_rank % m == 0)
    return StepPlan(per_epoch, total, int(total * cfg.warmup_ratio), micro, per_rank // micro)


# sft keys that change how checkpoints are kept or how long collectives wait, not what a step computes.
NOT_IN_FINGERPRINT = {
    "sft": (
        "save_every_steps",
        "save_every_minutes",
        "save_before_end_minutes",
        "collective_timeout_minutes",
        "keep_checkpoints",
    )
}


def run_fingerprint(cfg: SftConfig, seed: int, world_size: int, paths: SftPaths) -> dict[str, Any]:
    """What a checkpoint must share with this run to be resumed (:mod:`agentrl.training.fingerprint`):
    the ``sft`` section less ``NOT_IN_FINGERPRINT``, the seed, the process count, the SFT data and
    the DeepSpeed config by content, the base model's files by size and mtime."""
    return fingerprint_of(
        without_keys({"sft": dataclasses.asdict(cfg)}, NOT_IN_FINGERPRINT),
        seed=seed,
        world_size=world_size,
        model_dir=paths.model_dir,
        files={"data": paths.data, "deepspeed_config": paths.deepspeed_config},
    )


def micro_batch_loss_scales(targets: list[list[int]], weighting: str) -> list[list[float]]:
    """What each micro-batch's summed NLL is multiplied by before its backward, per rank.

    ``targets[r][b]``: trained targets of rank r's micro-batch b; W ranks, M micro-batches in all,
    N = sum of all targets. DeepSpeed averages gradients over the ranks, hence the factor W.

    - ``step_tokens``: ``W / N``, the step's loss is ``sum_b NLL_b / N`` (one token mean).
    - ``micro_batch_mean``: ``W / (M n_b)``, the loss ``(1/M) sum_b NLL_b / n_b`` with n_b micro-batch
      b's targets (at least 1: upstream adds 1e-8).
    - ``micro_batch_sum`` (upstream's fsdp_sft_trainer: ``backward`` on each micro-batch's token
      mean; its division by the micro-batch count comes after, for the logged loss only; FSDP
      averages over ranks): ``1``/n_b, the gradient of ``(1/W) sum_b NLL_b / n_b``, ``M / W``
      times ``micro_batch_mean``'s (4 for the paper's 4 micro-batches per rank) before clipping.
    """
    world = len(targets)
    if weighting == "step_tokens":
        total = max(sum(sum(rank) for rank in targets), 1)
        return [[world / total for _ in rank] for rank in targets]
    if weighting == "micro_batch_sum":
        return [[1 / max(n, 1) for n in rank] for rank in targets]
    assert weighting == "micro_batch_mean", f"sft.loss_weighting: unknown weighting {weighting!r}"
    count = sum(len(rank) for rank in targets)
    return [[world / (count * max(n, 1)) for n in rank] for rank in targets]


def _run_step(
    engine,
    examples: list[TokenizedExample],
    indices: list[int],
    cfg: SftConfig,
    ctx: dse.DistributedContext,
    pad_token_id: int,
) -> dict[str, float]:
    """Forward/backward of this rank's micro-batches of one step, then the optimizer step."""
    lengths = [len(examples[i].input_ids) for i in indices]
    per_rank = pack_micro_batches(
        lengths,
        cfg.micro_batch_size,
        cfg.micro_batch_tokens,
        ctx.world_size,
        cfg.micro_batch_overhead_tokens,
        packed=cfg.packing,
    )
    mine = per_rank[ctx.rank]
    step_targets = sum(examples[i].trained_targets for i in indices)
    targets = [[sum(examples[indices[p]].trained_targets for p in micro) for micro in rank] for rank in per_rank]
    scales = micro_batch_loss_scales(targets, cfg.loss_weighting)[ctx.rank]
    local = torch.zeros(3, dtype=torch.float64)  # nll sum, real tokens, padded tokens
    for position, micro in enumerate(mine):
        engine.set_gradient_accumulation_boundary(position == len(mine) - 1)
        chosen = [examples[indices[p]] for p in micro]
        batch = collate_packed(chosen) if cfg.packing else {**collate(chosen, pad_token_id), "packed": None}
        batch = {k: v.to(ctx.device) if v is not None else None for k, v in batch.items()}
        nll_sum, _ = engine(batch["input_ids"], batch["attention_mask"], batch["loss_mask"], batch["packed"])
        engine.backward(nll_sum * scales[position], scale_wrt_gas=False)
        real_tokens = sum(len(e.input_ids) for e in chosen)
        local += torch.tensor(
            [float(nll_sum.detach()), float(real_tokens), float(batch["input_ids"].numel())], dtype=torch.float64
        )
    engine.step()
    torch.distributed.all_reduce(local)
    return {
        "loss": float(local[0]) / max(step_targets, 1),
        "tokens": float(local[1]),
        "padded_tokens": float(local[2]),
        "trained_tokens": float(step_targets),
    }


def train_sft(
    cfg: SftConfig, seed: int, paths: SftPaths, tracking: TrackingConfig | None = None, stage: str = "sft"
) -> dict[str, Any]:
    """Train ``paths.model_dir`` on ``paths.data``; write the HF folder and metrics. Returns a summary.

    ``stage`` names the run in its logs, progress and checkpoint lock: ``sft``, or ``pretrain``
    (the embedded model's copying pretraining, :mod:`agentrl.sft.pretrain`, runs this loop too).

    A SIGUSR1 or SIGTERM makes the running step the last: its checkpoint is written and
    :class:`~agentrl.training.preemption.StoppedForRetry` is raised (:mod:`agentrl.training.preemption`);
    so does the exit of a parent process (:mod:`agentrl.training.parent_watch`). The checkpoint
    folder is locked for the run (:mod:`agentrl.training.folder_lock`): a second trainer refuses.
    """
    guards = training_stage(
        stage, paths.checkpoint_dir, "sft.collective_timeout_minutes", cfg.collective_timeout_minutes
    )
    with guards as stop:
        return _train_sft(cfg, seed, paths, stop, tracking, stage)


def _train_sft(
    cfg: SftConfig, seed: int, paths: SftPaths, stop, tracking: TrackingConfig | None, stage: str
) -> dict[str, Any]:
    """The SFT stage's loop: its step and checkpoint in :class:`~agentrl.training.loop.TrainingLoop`."""
    import deepspeed

    # DeepSpeed's ZeRO calls a torch collective that torch has deprecated; nothing for us to act on
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    ctx = dse.init_distributed(cfg.collective_timeout_minutes)
    dse.discard_incomplete_model(paths.out_dir, ctx, log)
    if not ctx.is_main:
        log.setLevel(logging.WARNING)
    deepspeed.utils.logger.setLevel(logging.WARNING)
    torch.manual_seed(seed)
    tokenizer, examples, plan, engine = _build(cfg, paths, ctx, seed)
    run = run_fingerprint(cfg, seed, ctx.world_size, paths)
    start, records = _resume_or_reset(engine, paths.checkpoint_dir, run, ctx)
    loop = TrainingLoop(
        stage,
        ctx,
        stop,
        start=start,
        total_steps=plan.total_steps,
        records=records,
        metrics=paths.metrics,
        checkpoint_dir=paths.checkpoint_dir,
        save_every_minutes=cfg.save_every_minutes,
        save_before_end_minutes=cfg.save_before_end_minutes,
        tracking=tracking,
        tracking_folder=paths.checkpoint_dir.parent,
        run_config=dataclasses.asdict(cfg),
        log=log,
    )

    def run_step(step: int) -> dict[str, Any]:
        began, lr = time.perf_counter(), dse.current_lr(engine)
        indices = step_indices(step - 1, len(examples), cfg.global_batch_size, seed)
        stats = _run_step(engine, examples, indices, cfg, ctx, tokenizer.pad_token_id)
        elapsed = time.perf_counter() - began
        return step_record(step, plan, stats, lr, dse.global_grad_norm(engine), elapsed)

    def save(step: int, records: list[dict[str, Any]]) -> None:
        state = {"fingerprint": run, "metrics": records}
        dse.save_checkpoint(engine, paths.checkpoint_dir, step, state, ctx, cfg.keep_checkpoints)

    def interval_due(step: int) -> bool:  # the last step's checkpoint is the final model instead
        return bool(cfg.save_every_steps) and step % cfg.save_every_steps == 0 and step != plan.total_steps

    started = time.perf_counter()
    final = loop.run(
        run_step, save, interval_due, postfix=lambda r: {"loss": f"{r['loss']:.3f}", "lr": f"{r['lr']:.2e}"}
    )
    dse.save_hf_model(engine, engine.module.lm, tokenizer, paths.out_dir, ctx)
    wall = time.perf_counter() - started
    log.info(
        "%s done: %d steps (%d this run) in %.1f s; final loss %s -> %s",
        {"sft": "SFT", "pretrain": "pretraining"}.get(stage, stage),
        plan.total_steps,
        plan.total_steps - start,
        wall,
        final.get("loss"),
        paths.out_dir,
    )
    return {"steps": plan.total_steps, "resumed_from": start, "wall_s": wall, "final": final}


def step_record(
    step: int, plan: StepPlan, stats: dict[str, float], lr: float, grad_norm: float | None, elapsed: float
) -> dict[str, Any]:
    """The metrics line of ``step``: ``lr`` is the rate the step used, ``elapsed`` its wall time."""
    return {
        "step": step,
        "epoch": round(step / plan.steps_per_epoch, 4),
        "loss": stats["loss"],
        "lr": lr,
        "grad_norm": grad_norm,
        "tokens_per_s": stats["tokens"] / elapsed,
        "step_time_s": elapsed,
        "trained_tokens": stats["trained_tokens"],
        "pad_fraction": 1.0 - stats["tokens"] / stats["padded_tokens"],
    }


def _build(
    cfg: SftConfig, paths: SftPaths, ctx: dse.DistributedContext, seed: int
) -> tuple[Any, list[TokenizedExample], StepPlan, Any]:
    """The tokenizer, the tokenized conversations, the step plan and the DeepSpeed engine (around
    the model, or its LoRA adapters with ``sft.lora``: checked before the tokenization)."""
    from transformers import AutoTokenizer

    problems = lora_section_problems("sft", cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    check_target_modules(paths.model_dir, cfg.lora, "sft.lora")
    tokenizer = AutoTokenizer.from_pretrained(paths.model_dir)
    examples = tokenize_examples(
        read_sft_examples(paths.data),
        tokenizer,
        cfg.max_length,
        cfg.truncation,
        source=str(paths.data),
        loss_mask_alignment=cfg.loss_mask_alignment,
    )
    check_trained_tokens(examples, str(paths.data))
    plan = plan_steps(cfg, len(examples), ctx.world_size)
    dtype = resolve_dtype(cfg.deepspeed.dtype, ctx.device)
    lm = load_causal_lm(
        paths.model_dir,
        dtype=dtype,
        gradient_checkpointing=cfg.deepspeed.gradient_checkpointing,
        lora=cfg.lora,
        lora_key="sft.lora",
        seed=derived_seed(seed, "sft-lora"),
    )
    engine = dse.build_stage_engine(
        AssistantTokenNll(lm),
        cfg,
        paths.deepspeed_config,
        ctx,
        dtype,
        hidden_size=lm.config.get_text_config().hidden_size,
        micro_batch_size=plan.micro_batch_size,
        accumulation=plan.accumulation,
        warmup_steps=plan.warmup_steps,
        total_steps=plan.total_steps,
    )
    log.info(
        "%d conversations, %d steps/epoch x %d epochs = %d steps (warmup %d), %d process(es), ZeRO-%d, %s",
        len(examples),
        plan.steps_per_epoch,
        cfg.epochs,
        plan.total_steps,
        plan.warmup_steps,
        ctx.world_size,
        cfg.deepspeed.zero_stage,
        dtype,
    )
    return tokenizer, examples, plan, engine


def _resume_or_reset(
    engine, checkpoint_dir: Path, fingerprint: dict[str, Any], ctx: dse.DistributedContext
) -> tuple[int, list[dict[str, Any]]]:
    """The step to start from and the metric records up to it: the last checkpoint's when it
    belongs to this run setup, else step 0 and no records."""
    state = dse.resume_if_same_run(engine, checkpoint_dir, ctx, fingerprint, log)
    if state is None:
        return 0, []
    log.info("resumed from %s after step %d", checkpoint_dir, state["step"])
    return int(state["step"]), list(state["metrics"])
