"""GRPO checkpoints on top of the shared DeepSpeed checkpoints (``agentrl.training.deepspeed_engine``).

A checkpoint of step k is the folder ``<checkpoints>/step_<k>/`` holding

- DeepSpeed's state (module, optimizer, lr schedule) and one RNG file per rank;
- ``trainer_state.json``: the step, the prompt sampler's position (``PromptSampler``), the
  metric records of steps 0..k and the run fingerprint (what made the run: config, seed,
  process count, input files; built by ``agentrl.grpo.runner.run_fingerprint``);
- a Hugging Face model folder (config, safetensors, tokenizer, chat template) beside them, so
  any checkpoint can be evaluated as it is (``eval.checkpoints`` in the config).

The Hugging Face files are written first and the ``latest`` pointer moves last (atomically, after
every rank has written its part), so a job killed while saving resumes from the previous complete
checkpoint. Resuming restores the metrics file from the checkpoint's records: lines that the
killed run wrote after its checkpoint (steps that will run again) disappear, and a metrics file
that Snakemake removed with a failed job's outputs comes back.

Only a checkpoint whose fingerprint equals this run's is resumed. The checkpoint folder is not a
Snakemake output, so it survives the re-run that a changed ``grpo.lr`` or a retrained SFT model
triggers; resuming the old run's final checkpoint there would train nothing and export the old
policy. A checkpoint of another run setup is discarded (with a warning naming what differs) and
the run starts from step 0, as SFT does (``agentrl.sft.trainer``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.grpo.distributed import all_gather, barrier
from agentrl.training import deepspeed_engine as dse

log = logging.getLogger("agentrl.grpo")

# Differences named in the discard warning; the rest are counted.
MAX_NAMED_DIFFERENCES = 8


def checkpoint_path(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step}"


def save_checkpoint(
    engine,
    root: str | Path,
    step: int,
    *,
    trainer_state: Mapping[str, Any],
    fingerprint: Mapping[str, Any],
    metrics: Sequence[Mapping[str, Any]],
    export_model: Callable[[Path], None],
    ctx: dse.DistributedContext,
    keep: int | None,
) -> Path:
    """Write the checkpoint of ``step`` (every rank calls this); returns its folder."""
    folder = checkpoint_path(root, step)
    if ctx.is_main:
        export_model(folder)
    state = {**trainer_state, "fingerprint": dict(fingerprint), "metrics": [dict(record) for record in metrics]}
    return dse.save_checkpoint(engine, Path(root), step, state, ctx, keep)


def fingerprint_differences(saved: Any, current: Any, prefix: str = "") -> list[str]:
    """The dotted keys at which two fingerprints differ (``[]``: the same run setup).

    Nested mappings are compared key by key, so a changed ``grpo.lr`` reads as ``grpo.lr`` rather
    than ``grpo``; any other value is compared whole.
    """
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        differences: list[str] = []
        for key in sorted(set(saved) | set(current), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in saved or key not in current:
                differences.append(name)
            else:
                differences += fingerprint_differences(saved[key], current[key], name)
        return differences
    return [] if saved == current else [prefix or "(fingerprint)"]


def _discard_reason(state: Mapping[str, Any], fingerprint: Mapping[str, Any]) -> str | None:
    """Why the checkpoint with trainer state ``state`` cannot be resumed by this run; None if it can."""
    saved = state.get("fingerprint")
    if saved is None:
        return "it has no run fingerprint (written before checkpoints stored one)"
    differences = fingerprint_differences(saved, fingerprint)
    if not differences:
        return None
    named = ", ".join(differences[:MAX_NAMED_DIFFERENCES])
    more = len(differences) - MAX_NAMED_DIFFERENCES
    return f"its run setup differs in {named}" + (f" and {more} more" if more > 0 else "")


def resume(engine, root: str | Path, ctx: dse.DistributedContext,
           fingerprint: Mapping[str, Any]) -> dict[str, Any] | None:
    """Restore the newest checkpoint into ``engine`` (and this rank's RNG) when its fingerprint is
    ``fingerprint``; its trainer state, or None when the run starts from step 0.

    A checkpoint of another run setup is deleted, every checkpoint in ``root`` with it: they all
    come from the run that wrote ``latest``, and a later save would otherwise prune among them.
    Rank 0 decides and tells the others, so the ranks cannot disagree (a model folder copied to
    each node has other mtimes there) and no rank reads a checkpoint that rank 0 is deleting.
    """
    decision: tuple[str, str] = ("fresh", "")
    if ctx.is_main:
        state = dse.read_latest_trainer_state(root)
        if state is not None:
            reason = _discard_reason(state, fingerprint)
            decision = ("resume", "") if reason is None else ("discard", f"step {state['step']}: {reason}")
    action, reason = all_gather(ctx, decision)[0]
    if action == "resume":
        return dse.load_checkpoint(engine, root, ctx)
    if action == "discard" and ctx.is_main:
        log.warning("the checkpoint in %s is not resumed (%s); deleting its checkpoints and the metrics "
                    "they recorded, starting from step 0", root, reason)
        dse.discard_checkpoints(root)
    barrier(ctx)
    return None
