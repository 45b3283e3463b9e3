"""The RL prompts in training order: shuffled per epoch, resumable from a two-number position.

verl's dataloader shuffles the RL set once per epoch and drops the last partial batch. Here
the order of epoch e is a permutation seeded by ``(seed, e)``, and (``grpo.epoch_end: carry``) a
batch that runs past the end of an epoch continues into the next epoch's order, so every problem
is used once per epoch and no problem is dropped (a deliberate departure: with dynamic sampling
the number of prompts drawn per step varies, and epoch-aligned batches would then skip
problems). ``drop_last`` is upstream's (``ray_trainer.py``: ``drop_last=True``): a batch never
crosses an epoch's end, the problems left there are skipped that epoch. The sampler's whole
state is ``(epoch, offset)``, saved in every checkpoint, so a resumed run draws exactly the
prompts the uninterrupted run would have drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from agentrl.data.records import Problem


class PromptSampler:
    def __init__(self, problems: Sequence[Problem], seed: int, *, shuffle: bool = True) -> None:
        assert problems, "the RL training set is empty"
        self.problems = list(problems)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.offset = 0

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.problems))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.problems))

    def next_batch(self, size: int, epoch_end: str = "carry") -> list[Problem]:
        """The next ``size`` problems, crossing into the next epoch's order when this one ends
        (``carry``), or from the next epoch's start when fewer than ``size`` are left (``drop_last``,
        ``grpo.epoch_end``)."""
        assert size >= 1, f"batch size must be >= 1, got {size}"
        if epoch_end == "drop_last" and len(self.problems) - self.offset < size <= len(self.problems):
            self.epoch, self.offset = self.epoch + 1, 0
        batch: list[Problem] = []
        while len(batch) < size:
            order = self.order(self.epoch)
            take = min(size - len(batch), len(order) - self.offset)
            batch += [self.problems[i] for i in order[self.offset : self.offset + take]]
            self.offset += take
            if self.offset == len(order):
                self.epoch, self.offset = self.epoch + 1, 0
        return batch

    @property
    def progress(self) -> float:
        """Epochs consumed, fractional."""
        return self.epoch + self.offset / len(self.problems)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset, "size": len(self.problems), "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["size"] != len(self.problems) or state["seed"] != self.seed:
            raise ValueError(
                f"the checkpoint's prompt order was made for {state['size']} problems with seed {state['seed']}, "
                f"this run has {len(self.problems)} problems and seed {self.seed}: the RL data or the seed changed "
                "since the checkpoint was written; remove the checkpoint folder to start over"
            )
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
