"""Seeds derived from the run's one ``seed``: every stage and step draws its own stream.

A derived seed depends only on (global seed, tag, index), never on how many steps this process
has run, which is what lets a resumed run continue with the seeds the uninterrupted one used.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from contextlib import contextmanager


def derived_seed(seed: int, tag: str, index: int = 0) -> int:
    """A 31-bit seed for (global seed, stage tag, chunk index): stable across runs and machines."""
    return zlib.crc32(f"{seed}:{tag}:{index}".encode()) & 0x7FFFFFFF


@contextmanager
def rng_state_kept() -> Iterator[None]:
    """Run the block, then put Python's, NumPy's and torch's global random states (CPU and every
    initialised CUDA device) back as they were before it.

    Building a vLLM engine reseeds all of them with the engine's seed (its worker calls
    ``set_random_seed``), which would replace the stream the trainer seeded from
    ``(seed, "grpo-torch", rank)`` before it; the engine draws its samples from per-request seeds,
    so it needs none of that state.
    """
    import numpy as np
    import torch

    python_state, numpy_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
