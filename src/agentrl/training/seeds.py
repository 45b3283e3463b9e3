"""Seeds derived from the run's one ``seed``: every stage and step draws its own stream.

A derived seed depends only on (global seed, tag, index), never on how many steps this process
has run, which is what lets a resumed run continue with the seeds the uninterrupted one used.
"""

from __future__ import annotations

import zlib


def derived_seed(seed: int, tag: str, index: int = 0) -> int:
    """A 31-bit seed for (global seed, stage tag, chunk index): stable across runs and machines."""
    return zlib.crc32(f"{seed}:{tag}:{index}".encode()) & 0x7FFFFFFF
