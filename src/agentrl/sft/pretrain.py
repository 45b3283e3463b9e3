"""The embedded base model's pretraining on copying conversations, run by SFT's trainer.

Why: the paper's recipe starts from a pretrained instruct model, which copies text from its
context before SFT begins; the embedded model starts from random weights, and its SFT learned to
copy numbers (what every family's reward needs) only after about 2100 steps, near an edge that a
different batching already fell off (docs/experiments.md). ``model.embedded.pretrain`` trains the
base model first on :mod:`agentrl.data.copy_corpus`, short conversations whose trained tokens are
nearly all copies, so that SFT teaches the tool protocol to a model that already copies.

How: the corpus is an SFT parquet (``python -m agentrl copy-corpus``), trained by :func:`agentrl.sft.trainer.train_sft`
(DeepSpeed, loss on the assistant turn, checkpoints and resume, metrics), with SFT's settings
except the recipe keys of ``model.embedded.pretrain`` (:data:`PRETRAIN_KEYS`): the same toolkit,
one set of machinery keys.
"""

from __future__ import annotations

import dataclasses

from agentrl.config import PretrainConfig, SftConfig

# The sft keys model.embedded.pretrain replaces; every other sft key applies to pretraining too.
PRETRAIN_KEYS = ("epochs", "global_batch_size", "lr", "lr_schedule", "warmup_ratio")


def pretrain_sft_config(pretrain: PretrainConfig, sft: SftConfig) -> SftConfig:
    """``sft`` with the pretraining recipe in place of SFT's (:data:`PRETRAIN_KEYS`), no ``sft.from``
    and no ``sft.lora``: pretraining starts from random weights, which a low-rank update cannot train."""
    lora = dataclasses.replace(sft.lora, enabled=False)
    return dataclasses.replace(sft, **{key: getattr(pretrain, key) for key in PRETRAIN_KEYS}, from_=None, lora=lora)
