"""GRPO checkpoints on top of the shared DeepSpeed checkpoints (``agentrl.training.deepspeed_engine``).

A checkpoint of step k is the folder ``<checkpoints>/step_<k>/`` holding

- DeepSpeed's state (module, optimizer, lr schedule) and one RNG file per rank;
- ``trainer_state.json``: the step, the prompt sampler's position (``PromptSampler``) and the
  metric records of steps 0..k;
- a Hugging Face model folder (config, safetensors, tokenizer, chat template) beside them, so
  any checkpoint can be evaluated as it is (``eval.checkpoints`` in the config).

The Hugging Face files are written first and the ``latest`` pointer moves last (atomically, after
every rank has written its part), so a job killed while saving resumes from the previous complete
checkpoint. Resuming restores the metrics file from the checkpoint's records: lines that the
killed run wrote after its checkpoint (steps that will run again) disappear, and a metrics file
that Snakemake removed with a failed job's outputs comes back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.training import deepspeed_engine as dse


def checkpoint_path(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step}"


def save_checkpoint(
    engine,
    root: str | Path,
    step: int,
    *,
    trainer_state: Mapping[str, Any],
    metrics: Sequence[Mapping[str, Any]],
    export_model: Callable[[Path], None],
    ctx: dse.DistributedContext,
    keep: int | None,
) -> Path:
    """Write the checkpoint of ``step`` (every rank calls this); returns its folder."""
    folder = checkpoint_path(root, step)
    if ctx.is_main:
        export_model(folder)
    state = {**trainer_state, "metrics": [dict(record) for record in metrics]}
    return dse.save_checkpoint(engine, Path(root), step, state, ctx, keep)


def resume(engine, root: str | Path, ctx: dse.DistributedContext) -> dict[str, Any] | None:
    """Restore the newest checkpoint into ``engine`` (and this rank's RNG); its trainer state, or
    None when there is no checkpoint."""
    if dse.read_latest_trainer_state(root) is None:
        return None
    return dse.load_checkpoint(engine, root, ctx)
