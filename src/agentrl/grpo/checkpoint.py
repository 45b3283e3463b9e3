"""GRPO checkpoints on top of the shared DeepSpeed checkpoints (``agentrl.training.deepspeed_engine``).

A checkpoint of step k is the folder ``<checkpoints>/step_<k>/`` holding

- DeepSpeed's state (module, optimizer, lr schedule) and one RNG file per rank;
- ``trainer_state.json``: the step, the prompt sampler's position (``PromptSampler``), the
  metric records of steps 0..k and the run fingerprint (what made the run: config, seed,
  process count, input files; built by ``agentrl.grpo.trainer.run_fingerprint``);
- a Hugging Face model folder (config, safetensors, tokenizer, chat template) beside them, so
  any checkpoint can be evaluated as it is (``eval.checkpoints`` in the config);
- ``rollouts_ahead.pkl`` under ``grpo.max_staleness`` >= 1 with a rollout process: the graded
  rollouts of the steps after k, made before k was checkpointed (step k + 1's, by version k - 1),
  which the resumed run trains on as the uninterrupted one did
  (:meth:`agentrl.grpo.rollout_process.RolloutProcess.rollouts_ahead`).

The Hugging Face files are written first and the ``latest`` pointer moves last (atomically, after
every rank has written its part), so a job killed while saving resumes from the previous complete
checkpoint. Resuming restores the metrics file from the checkpoint's records: lines that the
killed run wrote after its checkpoint (steps that will run again) disappear, and a metrics file
that Snakemake removed with a failed job's outputs comes back.

Only a checkpoint whose fingerprint equals this run's is resumed. The checkpoint folder is not a
Snakemake output, so it survives the re-run that a changed ``grpo.lr`` or a retrained SFT model
triggers; resuming the old run's final checkpoint there would train nothing and export the old
policy. A checkpoint of another run setup is never resumed and never deleted: after a deliberate
change it is set aside beside the folder and the run starts over, after a retry with another
process count the stage stops naming the command that starts over (``CheckpointOfAnotherRun``),
as SFT does (:func:`agentrl.training.deepspeed_engine.resume_if_same_run`).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agentrl.training import deepspeed_engine as dse

log = logging.getLogger("agentrl.grpo")
ROLLOUTS_AHEAD = "rollouts_ahead.pkl"


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
    policy: torch.nn.Module,
    tokenizer,
    ctx: dse.DistributedContext,
    keep: int | None,
    rollouts_ahead: Sequence[Any] = (),
) -> Path:
    """Write the checkpoint of ``step`` (every rank calls this), ``policy`` (the Hugging Face model
    inside ``engine``) exported as the final model is (:func:`~agentrl.training.deepspeed_engine.
    write_hf_folder`, which gathers ZeRO-3's partitions); returns its folder."""
    state = {**trainer_state, "fingerprint": dict(fingerprint), "metrics": [dict(record) for record in metrics]}

    def export(folder: Path) -> None:
        dse.write_hf_folder(engine, policy, tokenizer, folder, ctx)
        if ctx.is_main and rollouts_ahead:
            with open(folder / ROLLOUTS_AHEAD, "wb") as out:
                pickle.dump(list(rollouts_ahead), out, protocol=pickle.HIGHEST_PROTOCOL)

    return dse.save_checkpoint(engine, Path(root), step, state, ctx, keep, also=export)


def rollouts_ahead(root: str | Path, step: int) -> list[Any]:
    """The rollouts the checkpoint of ``step`` kept for the steps after it (none: roll them out)."""
    path = checkpoint_path(root, step) / ROLLOUTS_AHEAD
    if not path.exists():
        return []
    with open(path, "rb") as kept:
        return pickle.load(kept)  # written by this stage into its own checkpoint


def resume(
    engine, root: str | Path, ctx: dse.DistributedContext, fingerprint: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The newest checkpoint's trainer state when it comes from this run setup, else None (step 0);
    see :func:`agentrl.training.deepspeed_engine.resume_if_same_run`, shared with SFT."""
    return dse.resume_if_same_run(engine, root, ctx, fingerprint, log)
