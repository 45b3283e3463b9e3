"""DeepSpeed for the training stages: process group, engine, checkpoints, the final HF folder.

Shared by SFT and GRPO. The ZeRO settings live in ``configs/deepspeed/zero{0,2,3}.json``, written
as in DeepSpeed's and Hugging Face's examples with ``"auto"`` placeholders; :func:`fill_deepspeed_config`
fills those from our config (batch sizes, clipping, precision, bucket sizes from the model's hidden
size) and refuses any ``"auto"`` it does not know.

Choices, and why:
- The optimizer (``torch.optim.AdamW``) and the schedule (transformers' cosine / constant with
  linear warmup, the ones verl's trainers use) are built here and handed to ``deepspeed.initialize``
  rather than named in the JSON: DeepSpeed's own "AdamW" JIT-compiles a fused CUDA/CPU kernel,
  which this must not depend on. Weight decay applies to every parameter, as upstream's AdamW.
- The caller owns gradient accumulation: micro-batches are packed by a token budget, so their
  number varies from step to step; the caller marks the last one with
  ``set_gradient_accumulation_boundary`` and scales the loss itself (``backward(scale_wrt_gas=False)``).
- Checkpoints: ``engine.save_checkpoint`` (model, optimizer and scheduler states, per rank) plus our
  ``trainer_state.json`` and per-rank RNG states, all written before the ``latest`` pointer, which
  rank 0 replaces atomically after every rank has finished; a run killed mid-save resumes from the
  previous complete checkpoint.
- On CPU, DeepSpeed's shared-memory all-reduce kernel is not JIT-built (it serves inference
  only, and a build killed half-way used to wedge every later start on the host; see
  :func:`_skip_shared_memory_kernel`), so a CPU training start compiles nothing.
- One process still gets a (gloo or nccl) process group: DeepSpeed needs one. Its port is a free
  one, so parallel single-process jobs on one machine do not collide.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import random
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.config import ConfigError
from agentrl.training import checkpoint_files, lora
from agentrl.training.checkpoint_files import LATEST, PARTIAL_SUFFIX, TRAINER_STATE
from agentrl.training.fingerprint import (
    ACCIDENTAL_DIFFERENCES,
    describe_differences,
    differences_from,
)
from agentrl.training.hf_export import save_hf_folder

log = logging.getLogger("agentrl.training")

SOURCE_CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs" / "deepspeed"


@dataclass(frozen=True)
class DistributedContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# What torchrun sets for each rank, and what a one-process group sets to its own store.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

# The launcher variables of the one-process group this process made (none: it made none). A later
# init_distributed in the same process (the group is still up) sets them again, should something
# have removed them in between (a test harness that keeps them from the stages it starts).
_ONE_PROCESS_ENV: dict[str, str] = {}


def _one_process_group(backend: str, timeout) -> None:
    """A one-process group on a store of its own, bound to port 0 by the store itself.

    Probing a free port and binding it later races with every other process on the host, and a
    launcher's MASTER_PORT that this process inherited (its parent ran a group of its own) is held
    by the parent: either lost the port in CI (EADDRINUSE). The launcher variables are then set to
    this group's own store: DeepSpeed's ZeRO code reads LOCAL_RANK, and vLLM's external-launcher
    executor (the colocated engine) RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
    """
    store = torch.distributed.TCPStore("127.0.0.1", 0, 1, True, timeout=timeout)
    _ONE_PROCESS_ENV.update(dict(zip(LAUNCHER_VARIABLES, ("0", "1", "0", "127.0.0.1", str(store.port)), strict=True)))
    os.environ.update(_ONE_PROCESS_ENV)
    torch.distributed.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)


def init_distributed(timeout_minutes: float | None = None) -> DistributedContext:
    """Join the launcher's process group (or make a one-process one); pick the device.

    ``timeout_minutes`` bounds how long a collective waits for the slowest rank (torch's and
    DeepSpeed's default is 10 minutes). GRPO ranks meet at collectives after rollouts whose
    length differs from rank to rank by up to a whole 16-turn, 20K-token trajectory, and after
    validation, so the stages pass their ``collective_timeout_minutes`` (hours).
    """
    import datetime

    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if torch.distributed.is_initialized():
        os.environ.update(_ONE_PROCESS_ENV)
    else:
        timeout = datetime.timedelta(minutes=timeout_minutes or 10)
        backend = get_accelerator().communication_backend_name()
        if get_accelerator().device_name() == "cpu":
            _skip_shared_memory_kernel()
        if int(os.environ.get("WORLD_SIZE", "1")) == 1:
            # DeepSpeed wraps a group that is already up (deepspeed.comm.init_distributed).
            _one_process_group(backend, timeout)
        deepspeed.init_distributed(dist_backend=backend, verbose=False, timeout=timeout)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return DistributedContext(rank=rank, world_size=world, local_rank=local_rank, device=device)


def close_distributed() -> None:
    """Destroy the process group (all of them) if one is up; every rank calls it at the same point.

    Gloo's worker threads, when the interpreter tears the group down instead, can abort the
    process at exit (pytorch/pytorch#190489); torch asks trainers to call
    ``destroy_process_group`` near the end of main. DeepSpeed's own ``destroy_process_group``
    is the one called: it also forgets the clone of the world group that ``deepspeed.utils.groups``
    caches, which would otherwise outlive the group and break the next engine built in the same
    interpreter ("Group ... is not registered").
    """
    if torch.distributed.is_initialized():
        from deepspeed.comm import comm as deepspeed_comm

        if deepspeed_comm.cdb is None:  # a group DeepSpeed was never told of
            torch.distributed.destroy_process_group()
        else:
            deepspeed_comm.destroy_process_group()


def _skip_shared_memory_kernel() -> None:
    """Keep DeepSpeed's CPU backend from JIT-compiling ``deepspeed_shm_comm``.

    On CPU, ``deepspeed.init_distributed`` compiles that C++ kernel (60-160 s) under a lock file
    in ``~/.cache/torch_extensions`` unless a build is there. A job killed during the build leaves
    the lock and every later training start on the host waits on it forever, and the compiler
    processes outlive a kill of the job's process group. The kernel only serves DeepSpeed's
    inference all-reduce (tensor-parallel inference); training collectives go through
    ``torch.distributed`` (gloo), so marking the op incompatible, which makes DeepSpeed skip it
    as on a machine without a compiler, changes nothing a stage computes.
    """
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # DeepSpeed caches this dict once


class CollectiveTimeout(RuntimeError):
    """A collective waited longer than the configured timeout for another rank."""


_TIMEOUT_MARKERS = ("timed out", "timeout")


@contextlib.contextmanager
def collective_timeout_named(key: str, minutes: float) -> Iterator[None]:
    """Re-raise a collective's timeout (gloo raises it in Python) as :class:`CollectiveTimeout`
    naming the config ``key`` that sets it, so the fix is in the message. NCCL's watchdog aborts
    the process instead; the stage logs ``key`` and its value at start for that case."""
    try:
        yield
    except RuntimeError as exc:
        if isinstance(exc, CollectiveTimeout) or not any(m in str(exc).lower() for m in _TIMEOUT_MARKERS):
            raise
        raise CollectiveTimeout(
            f"a collective operation waited more than {key} = {minutes} minutes for another rank "
            f"(one rank's rollouts, validation or checkpoint took longer); raise {key} if that is "
            f"expected, else look for the rank that hung. Original error: {exc}"
        ) from exc


# --------------------------------------------------------------------------- config files
def find_deepspeed_config(zero_stage: int) -> Path:
    """``configs/deepspeed/zero<stage>.json`` of the working directory, else of the source checkout."""
    name = f"zero{zero_stage}.json"
    candidates = [Path.cwd() / "configs" / "deepspeed" / name, SOURCE_CONFIG_DIR / name]
    for path in candidates:
        if path.is_file():
            return path
    raise ConfigError(
        f"no DeepSpeed config for ZeRO stage {zero_stage}: looked for " + ", ".join(str(p) for p in candidates)
    )


def load_deepspeed_config(path: str | Path, zero_stage: int) -> dict[str, Any]:
    path = Path(path)
    try:
        template = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--deepspeed-config {path}: not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--deepspeed-config {path}: cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg})") from None
    if not isinstance(template, dict):
        raise ConfigError(f"{path}: a DeepSpeed config is a JSON object, got {type(template).__name__}")
    stage = template.get("zero_optimization", {}).get("stage", 0)
    if stage != zero_stage:
        raise ConfigError(
            f"{path} sets zero_optimization.stage={stage} but the config asks for "
            f"zero_stage={zero_stage}; use configs/deepspeed/zero{zero_stage}.json"
        )
    return template


def fill_deepspeed_config(
    template: dict[str, Any],
    *,
    micro_batch_size: int,
    gradient_accumulation_steps: int,
    world_size: int,
    grad_clip: float,
    dtype: torch.dtype,
    hidden_size: int,
    origin: str = "DeepSpeed config",
) -> dict[str, Any]:
    """A copy of ``template`` with every ``"auto"`` replaced by the value our config implies."""
    values = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "train_batch_size": micro_batch_size * gradient_accumulation_steps * world_size,
        "gradient_clipping": grad_clip,
        "bf16.enabled": dtype == torch.bfloat16,
        "fp16.enabled": dtype == torch.float16,
        # Hugging Face's heuristics for the bucket sizes, from the hidden size
        "zero_optimization.reduce_bucket_size": hidden_size * hidden_size,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
        "zero_optimization.stage3_param_persistence_threshold": 10 * hidden_size,
    }
    config = copy.deepcopy(template)

    def fill(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict):
                fill(value, f"{path}.")
            elif value == "auto":
                if path not in values:
                    raise ConfigError(
                        f"{origin}: '{path}' is \"auto\" but nothing fills it; set a value (fillable: {sorted(values)})"
                    )
                node[key] = values[path]

    fill(config, "")
    return config


# --------------------------------------------------------------------------- engine
@dataclass(frozen=True)
class OptimizerSettings:
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    schedule: str  # cosine | constant (after linear warmup)
    warmup_steps: int
    total_steps: int
    eps: float = 1e-8


def build_engine(model: torch.nn.Module, ds_config: dict[str, Any], optim: OptimizerSettings):
    """``deepspeed.initialize`` with AdamW and the warmup schedule; returns the engine."""
    import deepspeed
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    # The trainable parameters only: a LoRA model's frozen base weights get no moments.
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, weight_decay=optim.weight_decay
    )
    if optim.schedule == "cosine":
        scheduler = get_cosine_schedule_with_warmup(optimizer, optim.warmup_steps, optim.total_steps)
    elif optim.schedule == "constant":
        scheduler = get_constant_schedule_with_warmup(optimizer, optim.warmup_steps)
    else:
        raise ValueError(f"unknown lr schedule {optim.schedule!r}; choose cosine or constant")
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
    return engine


def build_stage_engine(
    model: torch.nn.Module,
    section: Any,
    deepspeed_config: str | Path,
    ctx: DistributedContext,
    dtype: torch.dtype,
    *,
    hidden_size: int,
    micro_batch_size: int,
    accumulation: int,
    warmup_steps: int,
    total_steps: int,
):
    """:func:`build_engine` with the optimizer and DeepSpeed settings of a stage's config section
    (``sft`` or ``grpo``: ``lr``, ``betas``, ``weight_decay``, ``lr_schedule``, ``grad_clip``,
    ``deepspeed.zero_stage``) and the ``"auto"`` values of ``deepspeed_config`` filled."""
    ds_config = fill_deepspeed_config(
        load_deepspeed_config(deepspeed_config, section.deepspeed.zero_stage),
        micro_batch_size=micro_batch_size,
        gradient_accumulation_steps=accumulation,
        world_size=ctx.world_size,
        grad_clip=section.grad_clip,
        dtype=dtype,
        hidden_size=hidden_size,
        origin=str(deepspeed_config),
    )
    optim = OptimizerSettings(
        lr=section.lr,
        betas=tuple(section.betas),
        weight_decay=section.weight_decay,
        schedule=section.lr_schedule,
        warmup_steps=warmup_steps,
        total_steps=total_steps,
    )
    return build_engine(model, ds_config, optim)


def current_lr(engine) -> float:
    return float(engine.get_lr()[0])


def global_grad_norm(engine) -> float | None:
    norm = engine.get_global_grad_norm()
    return None if norm is None else float(norm)


# --------------------------------------------------------------------------- checkpoints
def capture_rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tag(step: int) -> str:
    return f"step_{step}"


def save_checkpoint(
    engine,
    checkpoint_dir: str | Path,
    step: int,
    trainer_state: dict[str, Any],
    ctx: DistributedContext,
    keep: int | None,
    also: Callable[[Path], None] | None = None,
) -> Path:
    """Save a resumable checkpoint after optimizer step ``step`` and point ``latest`` at it;
    ``also(folder)`` writes more files into it, called on every rank (GRPO's Hugging Face export,
    which gathers ZeRO-3's partitions: a collective).

    Written to ``step_<n>.partial`` and renamed when every rank is done, with each file's size
    recorded (:mod:`agentrl.training.checkpoint_files`): a half-written step never exists under
    its final name, and a full disk fails with a message naming the folder.
    """
    checkpoint_dir = Path(checkpoint_dir)
    tag_dir = checkpoint_dir / _tag(step)
    partial_tag = _tag(step) + PARTIAL_SUFFIX
    partial = checkpoint_dir / partial_tag
    if ctx.is_main:
        checkpoint_files.remove_partial(checkpoint_dir)
    torch.distributed.barrier()  # no rank writes into a folder rank 0 is still removing
    try:
        with checkpoint_files.naming_a_full_disk(partial):
            partial.mkdir(parents=True, exist_ok=True)
            torch.save(capture_rng_state(), partial / f"rng_rank{ctx.rank}.pt")
            if also is not None:
                also(partial)
            if ctx.is_main:
                (partial / TRAINER_STATE).write_text(json.dumps({**trainer_state, "step": step}, indent=1))
            # frozen weights (a LoRA model's base) are the model folder's, in the run fingerprint
            engine.save_checkpoint(
                str(checkpoint_dir), tag=partial_tag, save_latest=False, exclude_frozen_parameters=True
            )
            torch.distributed.barrier()  # every rank's files are written before the folder is renamed
            if ctx.is_main:
                checkpoint_files.write_manifest(partial)
    except checkpoint_files.CheckpointWriteFailed:
        if ctx.is_main:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    if ctx.is_main:
        if tag_dir.exists():  # an earlier save of this step, from before a resume at an older one
            shutil.rmtree(tag_dir)
        partial.rename(tag_dir)
        checkpoint_files.fsync_folder(checkpoint_dir)
        tmp = checkpoint_dir / f"{LATEST}.tmp"
        tmp.write_text(_tag(step))
        tmp.replace(checkpoint_dir / LATEST)
        _prune(checkpoint_dir, keep)
    torch.distributed.barrier()
    return tag_dir


def _prune(checkpoint_dir: Path, keep: int | None) -> None:
    if keep is None:
        return
    for stale in checkpoint_files.step_folders(checkpoint_dir)[keep:]:
        shutil.rmtree(stale, ignore_errors=True)


def load_checkpoint(engine, checkpoint_dir: str | Path, ctx: DistributedContext, tag: str) -> None:
    """Restore model, optimizer, scheduler and this rank's RNG from the checkpoint ``tag``.

    A module with frozen parameters (a LoRA model's base weights) was saved without them
    (:func:`save_checkpoint`): they stay as loaded from the model folder, the rest is restored."""
    frozen = any(not p.requires_grad for p in engine.module.parameters())
    load_path, _ = engine.load_checkpoint(str(checkpoint_dir), tag=tag, load_module_strict=not frozen)
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {Path(checkpoint_dir) / tag}")
    rng_file = Path(checkpoint_dir) / tag / f"rng_rank{ctx.rank}.pt"
    restore_rng_state(torch.load(rng_file, weights_only=False))


class CheckpointOfAnotherRun(ConfigError):
    """The checkpoint folder holds a checkpoint of another run setup; it is kept, not resumed.

    A ConfigError: the stage exits 2 with this message (agentrl.training.cli.run_trainer), as for
    another config check that needs the running processes.
    """


def _start_over_hint(checkpoint_dir: Path, step: Any) -> str:
    aside = checkpoint_dir.with_name(f"{checkpoint_dir.name}.step_{step}")
    return (
        f"To train this setup from step 0, move the folder aside (mv {checkpoint_dir} {aside}) or remove it "
        f"(rm -r {checkpoint_dir}), then run again; to continue the old run, restore the settings it was written with"
    )


def set_aside(checkpoint_dir: Path, step: Any) -> Path:
    """Move the checkpoints of an earlier run setup from ``checkpoint_dir`` into the new sibling
    ``<checkpoint_dir>.step_<step>`` (``.2``, ``.3``, ... if taken); the trainer's lock file stays,
    as its holder keeps it open."""
    from agentrl.training.folder_lock import LOCK_FILE

    aside = checkpoint_dir.with_name(f"{checkpoint_dir.name}.step_{step}")
    copy_number = 2
    while aside.exists():
        aside = checkpoint_dir.with_name(f"{checkpoint_dir.name}.step_{step}.{copy_number}")
        copy_number += 1
    aside.mkdir()
    for entry in sorted(checkpoint_dir.iterdir()):
        if entry.name != LOCK_FILE:
            entry.rename(aside / entry.name)
    return aside


def _decide(checkpoint_dir: Path, fingerprint: Mapping[str, Any], logger: logging.Logger) -> tuple:
    """Rank 0: ``("resume", tag, state)``, ``("refuse", reason, None)`` or ``("fresh", note, None)``."""
    # a damaged newer checkpoint is named in a warning and moved aside; the newest intact one is chosen
    chosen = checkpoint_files.choose_checkpoint(checkpoint_dir, logger)
    if chosen is None:
        return ("fresh", "", None)
    tag, state = chosen
    differences = differences_from(state, fingerprint)
    if not differences:
        return ("resume", tag, state)
    reason = f"step {state['step']}: {describe_differences(differences)}"
    if set(differences) <= ACCIDENTAL_DIFFERENCES:
        return ("refuse", reason, None)
    aside = set_aside(checkpoint_dir, state["step"])
    return (
        "fresh",
        f"{checkpoint_dir} held the checkpoint of another run setup ({reason}): it is kept in {aside}, and "
        f"this run trains from step 0 (to continue the old run instead, restore its settings, then "
        f"rm -r {checkpoint_dir} && mv {aside} {checkpoint_dir})",
        None,
    )


def resume_if_same_run(
    engine,
    checkpoint_dir: str | Path,
    ctx: DistributedContext,
    fingerprint: Mapping[str, Any],
    logger: logging.Logger = log,
) -> dict[str, Any] | None:
    """Restore the newest checkpoint into ``engine`` (and this rank's RNG) when its trainer state
    carries ``fingerprint``; its trainer state, or None when this run starts at step 0.

    The checkpoint folder is not a Snakemake output, so it survives the re-run that a changed
    config or input triggers: resuming the old run's checkpoint there would continue (or finish)
    the wrong run. A checkpoint of another run setup is therefore never resumed and never
    deleted. After a deliberate change (a config key, an input) it is set aside, whole, into
    ``<folder>.step_<n>`` (:func:`set_aside`) and the run trains from step 0, saying so: the one
    command the docs give reruns a changed key. A retry that differs only in where it runs (the
    process count, :data:`ACCIDENTAL_DIFFERENCES`) must not restart silently: it raises
    :class:`CheckpointOfAnotherRun` naming the keys and the command that starts over, and nothing
    in the folder is touched. Rank 0 decides and tells the others, so the ranks cannot disagree
    (a model folder copied to each node has other mtimes there).
    """
    checkpoint_dir = Path(checkpoint_dir)
    decision = [_decide(checkpoint_dir, fingerprint, logger) if ctx.is_main else None]
    torch.distributed.broadcast_object_list(decision, src=0)
    action, detail, state = decision[0]
    if action == "resume":
        load_checkpoint(engine, checkpoint_dir, ctx, tag=detail)
        return state
    if action == "refuse":
        step = detail.split(":", 1)[0].removeprefix("step ")
        raise CheckpointOfAnotherRun(
            f"{checkpoint_dir} holds the checkpoint of another run setup, which is kept and not resumed "
            f"({detail}). {_start_over_hint(checkpoint_dir, step)}"
        )
    if detail:
        logger.warning("%s", detail)
    return None


# --------------------------------------------------------------------------- final model
def discard_incomplete_model(out_dir: str | Path, ctx: DistributedContext, logger: logging.Logger = log) -> None:
    """Rank 0, at a training stage's start: remove ``out_dir`` when it holds no ``config.json``.

    Snakemake removes the outputs a job makes before it runs, and the workflow tracks a model by
    its ``config.json``; the rest of the previous model stays until the stage writes the new one at
    its end (:func:`save_hf_model`). A job that then fails would leave weights without a config.
    """
    out_dir = Path(out_dir)
    if not ctx.is_main or not out_dir.is_dir() or (out_dir / "config.json").exists():
        return
    entries = list(out_dir.iterdir())
    # only what an export writes (a mistyped --out that names another folder is left alone)
    if entries and all(_written_by_export(entry) for entry in entries):
        logger.info("removing %s: a model folder without config.json (the previous model's remains)", out_dir)
        shutil.rmtree(out_dir)


def _written_by_export(entry: Path) -> bool:
    """Whether ``entry`` of a model folder is one :func:`save_hf_model` writes (weights, generation
    config, tokenizer files, chat template, a LoRA run's ``adapter/``)."""
    if entry.is_dir():
        return entry.name == "adapter"
    return entry.suffix in (".safetensors", ".json", ".jinja", ".txt", ".model") or entry.name.startswith("tokenizer")


def write_hf_folder(engine, model: torch.nn.Module, tokenizer, folder: str | Path, ctx: DistributedContext) -> None:
    """Every rank: ``model`` (a module inside the engine) and the tokenizer as a Hugging Face folder,
    written by rank 0 one tensor at a time (:func:`agentrl.training.hf_export.save_hf_folder`: no
    clone of ZeRO-2's flat buffer).

    Under ZeRO-3 each rank holds a partition of every parameter (the module's own tensors are
    empty), so the parameters are gathered on every rank first, a collective: a checkpoint's folder
    written from the partitions alone would hold tensors of shape [0].
    """
    import deepspeed

    zero3 = engine.zero_optimization_stage() == 3
    params = list(model.parameters()) if zero3 else []
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None, enabled=zero3):
        if ctx.is_main and lora.is_lora(model):  # merged weights, the adapter beside them (not under ZeRO-3)
            lora.save_merged_folder(model, tokenizer, folder)
        elif ctx.is_main:
            save_hf_folder(model, tokenizer, folder)


def save_hf_model(engine, model: torch.nn.Module, tokenizer, out_dir: str | Path, ctx: DistributedContext) -> None:
    """Every rank: the final model as a Hugging Face folder (:func:`write_hf_folder`), written to
    ``<out>.tmp`` and renamed, so a killed job never leaves a folder that looks complete."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    write_hf_folder(engine, model, tokenizer, tmp, ctx)
    if ctx.is_main:
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
    torch.distributed.barrier()
