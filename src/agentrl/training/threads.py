"""CPU threads of a stage's process."""

from __future__ import annotations


def set_torch_threads(threads: int | None) -> None:
    """Use the CPU threads the job was given (Snakemake's ``threads``): more intra-op threads
    than cores makes every small matmul of CPU decoding several times slower under load."""
    if threads is not None:
        import torch

        assert threads >= 1, f"--threads must be >= 1, got {threads}"
        torch.set_num_threads(threads)
