"""The GRPO stage from files to files: build the parts, resume, train, validate, checkpoint, export.

The steps run in the loop SFT shares (:class:`agentrl.training.loop.TrainingLoop`); one step is
:class:`agentrl.grpo.step.GrpoStep`.

Inputs: the SFT model folder, ``rl_train.parquet``, the eval sets. Outputs: the final policy as
a Hugging Face folder (safetensors, tokenizer, chat template), ``metrics.jsonl`` (one line per
step, ``step`` 0 = validation before training) and the checkpoints folder. A run that finds a
checkpoint resumes from the newest one (:mod:`agentrl.grpo.checkpoint`): the step after it is
the next one run, with the same prompts and rollout seeds the uninterrupted run would have used.
Only a checkpoint of the same run setup is resumed (``run_fingerprint``); one of another setup
(a changed ``grpo.lr``, a retrained SFT model, new RL data) is refused and kept, and the stage
stops naming what differs and the command that starts over.

Seeds: the prompt order comes from ``(seed, "grpo-data")``, rollouts of step k from
``(seed, step k, round)`` with the problem, sample and turn (never the rank), validation from ``(seed, set)``; none depend on how many steps
this process has run, which is what makes a resumed run continue rather than restart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.config import Config, rollout_placement
from agentrl.grpo.checkpoint import resume, rollouts_ahead, save_checkpoint
from agentrl.grpo.collection import rollout_parts
from agentrl.grpo.distributed import barrier
from agentrl.grpo.metrics import console_line
from agentrl.grpo.policy import AdapterDisabled, ResponseLogProbs, engine_weights, old_logprobs_source
from agentrl.grpo.prompts import PromptSampler
from agentrl.grpo.step import Components, GrpoStep
from agentrl.grpo.validation import EvalSet, fit_eval_sets, limit_problems, validate
from agentrl.grpo.variants import AlgorithmSettings, grpo_reward_config, resolve_algorithm
from agentrl.model.tokenizer import load_chat_tokenizer, pad_token_id
from agentrl.precision import resolve_dtype
from agentrl.rewards.ground_truth import read_gradable_problems
from agentrl.rollout.memory_plan import TrainerMemory, trainer_growth_bytes
from agentrl.training import deepspeed_engine as dse
from agentrl.training.fingerprint import fingerprint_of, without_keys
from agentrl.training.loop import TrainingLoop, training_stage
from agentrl.training.lora import MergedWeightSource
from agentrl.training.model import load_causal_lm
from agentrl.training.seeds import derived_seed, rng_state_kept

log = logging.getLogger("agentrl.grpo")

TIMEOUT_KEY = "grpo.collective_timeout_minutes"


@dataclass(frozen=True)
class GrpoPaths:
    model: Path  # the initial policy (the SFT model), a Hugging Face folder
    train: Path  # rl_train.parquet
    eval_sets: tuple[Path, ...]  # validation sets, one parquet each (named by file stem)
    out: Path  # the final policy
    metrics: Path  # metrics.jsonl
    checkpoints: Path
    deepspeed_config: Path  # a configs/deepspeed/zero<stage>.json with "auto" placeholders


# Config keys left out of the run fingerprint: they change where a step runs, how fast, or how
# checkpoints are kept, not what it computes, so a run resumed with another value ends as the
# uninterrupted one would (up to vLLM's batch-dependent numerics, which no setting makes exact).
# Every other key of the sections below is in, the validation settings too: the checkpoint carries
# the metric records, and a resumed run must not mix validations made two ways in one file.
NOT_IN_FINGERPRINT = {
    "grpo": (
        "save_freq",
        "save_every_minutes",
        "save_before_end_minutes",
        "collective_timeout_minutes",
        "keep_checkpoints",
        "rollout_queue",  # which rank rolls out a group: the same trajectories on any
        "queue_groups_in_flight",
        "rollout_share",  # the rollout processes' devices
        "rollout_engines",  # which engine rolls out a group: the same trajectories on any
    ),
    "sandbox": ("workers", "sandbox_fusion_url"),  # parallelism and the service's address
    "rollout.vllm": (
        "gpu_memory_utilization",
        "colocated_gpu_memory_utilization",
        "colocated_memory",
        "sleep_mode",
        "max_num_seqs",
        "enforce_eager",
    ),  # memory and speed
}
# The config sections a GRPO step reads (the same as the rule's params in rules/rl.smk): the
# sampling (rollout), the tool's output (tool), what code execution returns (sandbox: time and
# memory limits, backend), the scores (reward) and the algorithm and optimizer (grpo).
FINGERPRINT_SECTIONS = ("grpo", "rollout", "reward", "tool", "sandbox")


def run_fingerprint(cfg: Config, paths: GrpoPaths, world_size: int) -> dict[str, Any]:
    """What a checkpoint must share with this run to be resumed (:mod:`agentrl.training.fingerprint`):
    the config sections that shape training (less ``NOT_IN_FINGERPRINT``), the seed, the process
    count (the trajectories do not depend on it, but the float summation order of the update
    and the trainer's per-rank random states do), the RL and validation parquets and the DeepSpeed
    config by content, the initial model's files by size and mtime."""
    sections = {name: dataclasses.asdict(getattr(cfg, name)) for name in FINGERPRINT_SECTIONS}
    return fingerprint_of(
        without_keys(sections, NOT_IN_FINGERPRINT),
        seed=cfg.seed,
        world_size=world_size,
        model_dir=paths.model,
        files={
            "train": paths.train,
            "eval": {Path(p).stem: p for p in paths.eval_sets},
            "deepspeed_config": paths.deepspeed_config,
        },
    )


def total_steps(cfg: Config, num_problems: int) -> int:
    """``grpo.max_steps``, else ``epochs x (problems // batch_prompts)`` (verl's dataloader length)."""
    if cfg.grpo.max_steps is not None:
        return cfg.grpo.max_steps
    return cfg.grpo.epochs * max(1, num_problems // cfg.grpo.batch_prompts)


def optimizer_steps_per_step(cfg: Config) -> int:
    return cfg.grpo.ppo_epochs * -(-cfg.grpo.batch_prompts // cfg.grpo.mini_batch_prompts)


def check_config(cfg: Config) -> None:
    """The cross-key checks (:func:`agentrl.config.check_cross_keys`), which the workflow runs at load too."""
    from agentrl.config import check_cross_keys

    check_cross_keys(cfg)
    if cfg.rollout.engine == "vllm":
        from agentrl.rollout.vllm_engine import check_colocated

        check_colocated(cfg.rollout)


def reward_config(cfg: Config, settings: AlgorithmSettings):
    """The reward section with overlong shaping as the variant and reward.overlong.enable say."""
    return grpo_reward_config(cfg.reward, settings)


def build_engine(
    actor: torch.nn.Module, cfg: Config, paths: GrpoPaths, ctx: dse.DistributedContext, dtype: torch.dtype, steps: int
):
    """DeepSpeed around the actor: one sequence list per backward, boundaries set by the trainer."""
    return dse.build_stage_engine(
        actor,
        cfg.grpo,
        paths.deepspeed_config,
        ctx,
        dtype,
        hidden_size=actor.model.config.get_text_config().hidden_size,
        micro_batch_size=1,
        accumulation=1,
        warmup_steps=cfg.grpo.lr_warmup_steps,
        total_steps=steps * optimizer_steps_per_step(cfg),
    )


def build_components(cfg: Config, paths: GrpoPaths, ctx: dse.DistributedContext, sandbox, steps: int):
    """The DeepSpeed actor, the reference (KL variants), the rollout engine, agent loop and reward."""
    from agentrl.rollout import make_engine

    settings = resolve_algorithm(cfg.grpo)
    tokenizer = load_chat_tokenizer(paths.model)
    pad_id = pad_token_id(tokenizer)
    dtype = resolve_dtype(cfg.grpo.deepspeed.dtype, ctx.device)
    # In the training dtype: DeepSpeed casts the module to it and builds its fp32 master weights
    # from the cast copy, so a float32 load would only cost a transient 16 GB per 4B rank.
    model = load_causal_lm(
        paths.model,
        dtype=dtype,
        device=ctx.device,
        gradient_checkpointing=cfg.grpo.deepspeed.gradient_checkpointing,
        lora=cfg.grpo.lora,
        lora_key="grpo.lora",
        seed=derived_seed(cfg.seed, "grpo-lora"),
    )
    actor = ResponseLogProbs(model, logit_chunk_tokens=cfg.grpo.logit_chunk_tokens, temperature=cfg.rollout.temperature)
    engine = build_engine(actor, cfg, paths, ctx, dtype, steps)
    reference = None
    if settings.uses_reference and cfg.grpo.lora.enabled:  # the actor with its adapter off: no second model
        reference = AdapterDisabled(engine.module)
    elif settings.uses_reference:
        ref_model = load_causal_lm(paths.model, dtype=dtype, device=ctx.device).eval().requires_grad_(False)
        reference = ResponseLogProbs(
            ref_model, logit_chunk_tokens=cfg.grpo.logit_chunk_tokens, temperature=cfg.rollout.temperature
        )
    policy = engine.module.model
    rollout_engine = loop = reward_fn = None  # separate placement: the rollout process's (start_rollout_process)
    if rollout_placement(cfg.grpo) == "colocated":
        with rng_state_kept():  # vLLM's worker reseeds the global generators seeded in _train
            rollout_engine = make_engine(
                cfg.rollout,
                str(paths.model),
                model=policy,
                tokenizer=tokenizer,
                colocated=True,
                seed=derived_seed(cfg.seed, "grpo-engine", ctx.rank),
                trainer_memory=trainer_memory(cfg, policy, ctx.world_size),
            )
        loop, reward_fn = rollout_parts(cfg, rollout_engine, tokenizer, sandbox)
    parts = Components(
        cfg=cfg,
        settings=settings,
        ctx=ctx,
        engine=engine,
        reference=reference,
        rollout_engine=rollout_engine,
        loop=loop,
        reward_fn=reward_fn,
        pad_token_id=int(pad_id),
        old_logprobs=old_logprobs_source(
            cfg.grpo.old_logprobs, cfg.rollout, next(actor.parameters()).dtype, cfg.grpo.max_staleness
        ),
    )
    log.info("old log-probs: %s (grpo.old_logprobs: %s)", parts.old_logprobs, cfg.grpo.old_logprobs)
    return parts, tokenizer


def start_rollout_process(cfg: Config, paths: GrpoPaths, parts: Components, eval_sets, steps: int):
    """The separate placement's rollout process (:mod:`agentrl.grpo.rollout_process`), held by rank 0
    (the other ranks get a :class:`~agentrl.grpo.rollout_process.RolloutPeer`). On CUDA it runs on
    the node's last GPUs (:func:`agentrl.config.gpu_split`), the trainer's ranks on
    the first; on CPU it takes ``grpo.rollout_share`` of this process's threads."""
    from agentrl.grpo.rollout_process import RolloutPeer, RolloutProcess, TrainerWeights, rollout_gpus

    ctx = parts.ctx
    policy = parts.engine.module.model
    source = MergedWeightSource(policy) if cfg.grpo.lora.enabled else TrainerWeights(policy)
    gpus = rollout_gpus(cfg, ctx, os.environ) if ctx.device.type == "cuda" else None
    if not ctx.is_main:
        return RolloutPeer(cfg, source, ctx, gpus)
    threads = torch.get_num_threads()
    if gpus:
        rollout_threads = threads
        log.info("trainer on %d GPU(s), rollout process on GPU(s) %s", ctx.world_size, ",".join(gpus))
    else:
        rollout_threads = max(1, min(threads - 1, round(threads * cfg.grpo.rollout_share)))
        if threads < 2:
            log.warning("separate placement with one CPU thread: the trainer and the rollout process share it")
        torch.set_num_threads(max(1, threads - rollout_threads))
        log.info(
            "trainer %d thread(s), rollout process %d (grpo.rollout_share)", torch.get_num_threads(), rollout_threads
        )
    return RolloutProcess(
        cfg,
        paths.model,
        paths.train,
        eval_sets,
        source,
        ctx,
        threads=rollout_threads,
        total_steps=steps,
        gpus=gpus,
    )


def trainer_memory(cfg: Config, policy: torch.nn.Module, world_size: int) -> TrainerMemory:
    """What this rank's trainer adds at its first step, and the rank's trajectories per rollout
    (for ``rollout.vllm.colocated_memory: measured``)."""
    parameters = sum(p.numel() for p in policy.parameters())
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)  # a LoRA policy's: its adapters
    param_bytes = next(policy.parameters()).element_size()
    return TrainerMemory(
        parameters=parameters,
        growth_bytes=trainer_growth_bytes(trainable, world_size, cfg.grpo.deepspeed.zero_stage, param_bytes),
        trajectories_per_rank=cfg.grpo.batch_prompts * cfg.grpo.n // world_size,
    )


def train(cfg: Config, paths: GrpoPaths) -> int:
    """Run (or resume) the GRPO stage; returns the number of steps trained by this call.

    A SIGUSR1 or SIGTERM makes the running step the last: its checkpoint is written and
    :class:`~agentrl.training.preemption.StoppedForRetry` is raised (:mod:`agentrl.training.preemption`);
    so does the exit of a parent process (:mod:`agentrl.training.parent_watch`). The checkpoint
    folder is locked for the run (:mod:`agentrl.training.folder_lock`): a second trainer refuses.
    """
    with training_stage("grpo", paths.checkpoints, TIMEOUT_KEY, cfg.grpo.collective_timeout_minutes) as stop:
        return _train(cfg, paths, stop)


def _train(cfg: Config, paths: GrpoPaths, stop) -> int:
    """The stage's setup: process group, inputs, components, resume, metrics; then :func:`_run_steps`."""
    from agentrl.tools.factory import make_sandbox

    check_config(cfg)
    ctx = dse.init_distributed(cfg.grpo.collective_timeout_minutes)
    dse.discard_incomplete_model(paths.out, ctx, log)
    if not ctx.is_main:
        log.setLevel(logging.WARNING)
    log.info(
        "collectives wait up to %s minutes for the slowest rank (%s)", cfg.grpo.collective_timeout_minutes, TIMEOUT_KEY
    )
    torch.manual_seed(derived_seed(cfg.seed, "grpo-torch", ctx.rank))
    problems, eval_sets = read_inputs(cfg, paths)
    steps = total_steps(cfg, len(problems))
    sampler = PromptSampler(problems, derived_seed(cfg.seed, "grpo-data"))
    fingerprint = run_fingerprint(cfg, paths, ctx.world_size)
    separate = rollout_placement(cfg.grpo) == "separate"  # the rollout process has its own sandbox
    with contextlib.ExitStack() as stack:
        sandbox = None if separate else stack.enter_context(make_sandbox(cfg.sandbox))
        parts, tokenizer = build_components(cfg, paths, ctx, sandbox, steps)
        eval_sets = fit_eval_sets(eval_sets, tokenizer, cfg.rollout)
        start, records = resume_run(parts, paths, fingerprint, sampler, steps)
        if separate:  # closed (its rollouts in flight discarded) however the stage ends
            process = stack.enter_context(
                contextlib.closing(start_rollout_process(cfg, paths, parts, eval_sets, steps))
            )
            process.begin(
                start, sampler.state_dict(), rollouts_ahead(paths.checkpoints, start) if start and ctx.is_main else []
            )
            parts.rollout_process = process
        loop = TrainingLoop(
            "grpo",
            ctx,
            stop,
            start=start,
            total_steps=steps,
            records=records,
            metrics=paths.metrics,
            checkpoint_dir=paths.checkpoints,
            save_every_minutes=cfg.grpo.save_every_minutes,
            save_before_end_minutes=cfg.grpo.save_before_end_minutes,
            tracking=cfg.tracking,
            run_config=dataclasses.asdict(cfg),
            echo=lambda r: log.info(console_line(r, steps)),
            log=log,
        )
        log.info(
            "GRPO %s: %d problems, %d steps of %d prompts x %d, %d process(es)",
            cfg.grpo.variant,
            len(problems),
            steps,
            cfg.grpo.batch_prompts,
            cfg.grpo.n,
            ctx.world_size,
        )
        _run_steps(loop, parts, tokenizer, sampler, eval_sets, paths, fingerprint)
    return steps - start


def _run_steps(
    loop: TrainingLoop,
    parts: Components,
    tokenizer,
    sampler: PromptSampler,
    eval_sets: list[EvalSet],
    paths: GrpoPaths,
    fingerprint: dict[str, Any],
) -> None:
    """The GRPO stage's loop: its step, validation and checkpoint in :class:`~agentrl.training.loop.TrainingLoop`,
    then the final policy folder."""
    cfg, ctx, steps = parts.cfg, parts.ctx, loop.total_steps
    policy = parts.engine.module.model

    def run_validation() -> dict:
        began = time.perf_counter()
        if parts.rollout_process is not None:  # on the weights it loaded last: the trainer's
            metrics = parts.rollout_process.validate()
        else:
            metrics = validate(cfg, parts.loop, parts.reward_fn, eval_sets, ctx)
        return {**metrics, "timing/validation_s": time.perf_counter() - began}

    if loop.start == 0 and cfg.grpo.val_before_train and eval_sets:
        loop.emit({"step": 0, **run_validation()})
    stepper = GrpoStep(parts)

    def run_step(step: int) -> dict:
        record = stepper.run(step, sampler)
        if eval_sets and cfg.grpo.test_freq and (step % cfg.grpo.test_freq == 0 or step == steps):
            record.update(run_validation())
        return record

    def save(step: int, records: list[dict]) -> None:
        save_checkpoint(
            parts.engine,
            paths.checkpoints,
            step,
            trainer_state={"sampler": sampler.state_dict(), "total_steps": steps, "variant": cfg.grpo.variant},
            fingerprint=fingerprint,
            metrics=records,
            policy=policy,
            tokenizer=tokenizer,
            rollouts_ahead=parts.rollout_process.rollouts_ahead(step) if parts.rollout_process is not None else (),
            ctx=ctx,
            keep=cfg.grpo.keep_checkpoints,
        )

    def interval_due(step: int) -> bool:  # the last step's checkpoint too, when save_freq is set
        return bool(cfg.grpo.save_freq) and (step % cfg.grpo.save_freq == 0 or step == steps)

    loop.run(run_step, save, interval_due)
    dse.save_hf_model(parts.engine, policy, tokenizer, paths.out, ctx)
    barrier(ctx)


def read_inputs(cfg: Config, paths: GrpoPaths) -> tuple[list, list[EvalSet]]:
    """The RL problems and the validation sets (each cut to ``grpo.validation.max_problems``)."""
    problems = read_gradable_problems(paths.train)
    limit = cfg.grpo.validation.max_problems
    return problems, [EvalSet(p.stem, limit_problems(read_gradable_problems(p), limit)) for p in paths.eval_sets]


def resume_run(
    parts: Components, paths: GrpoPaths, fingerprint: dict[str, Any], sampler: PromptSampler, steps: int
) -> tuple[int, list[dict[str, Any]]]:
    """The step to start after and the metric records up to it: the newest checkpoint's when it
    belongs to this run setup (its prompt order restored into ``sampler``), else 0 and none."""
    state = resume(parts.engine, paths.checkpoints, parts.ctx, fingerprint)
    if state is None:
        return 0, []
    sampler.load_state_dict(state["sampler"])
    # The rollout engine loaded the initial model: the resumed policy must reach it before the
    # first rollout, not only after the next update (a rollout process gets it when it starts).
    if parts.rollout_engine is not None:
        parts.rollout_engine.update_weights(engine_weights(parts.engine.module.model, parts.cfg.rollout))
    log.info("resumed from %s: step %d of %d done", paths.checkpoints, int(state["step"]), steps)
    return int(state["step"]), list(state["metrics"])
