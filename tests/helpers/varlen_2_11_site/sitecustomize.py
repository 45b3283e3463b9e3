"""Packed attention on torch 2.11.0's ``varlen_attn`` in every Python process that has this folder on
its ``PYTHONPATH`` (benchmarks/gpu_check.sh, the stages it starts, their rollout processes).

When ``agentrl.training.packing`` is imported, ``torch.nn.attention.varlen.varlen_attn`` becomes
torch 2.11.0's own (``tests/fixtures/torch-2.11.0-varlen.py.txt``, its flash kernel calls run on
CPU: tests/helpers/torch_varlen.py) and packed rows take the CUDA branch (the flash one) on a CPU
too, so a torch 2.11 GPU node's code path runs here: the keywords packing passes, the heads it
repeats for 2.11's signature, the ops' autograd. Each process that called the kernel appends
``<pid> forward=<n> backward=<n> <argv>`` to the file ``$AGENTRL_VARLEN_CALLS`` at exit.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

HELPER = Path(__file__).resolve().parents[1] / "torch_varlen.py"
TARGET = "agentrl.training.packing"


def _substitute(packing) -> None:
    import torch.nn.attention.varlen

    spec = importlib.util.spec_from_file_location("agentrl_test_torch_varlen", HELPER)
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    varlen = helper.load_varlen(helper.TORCH_2_11_VARLEN)
    torch.nn.attention.varlen.varlen_attn = varlen.varlen_attn
    packed_attention = packing._packed_attention

    def flash_on_cpu(query, key, value, scaling, kwargs, flash):
        return packed_attention(query, key, value, scaling, kwargs, True)

    packing._packed_attention = flash_on_cpu
    calls = os.environ.get("AGENTRL_VARLEN_CALLS")
    if calls:

        def record() -> None:
            counts = varlen.kernel_calls
            if counts:
                with open(calls, "a") as out:
                    out.write(f"{os.getpid()} forward={counts['forward']} backward={counts['backward']} {sys.argv}\n")

        atexit.register(record)


class _OnPackingImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of ``agentrl.training.packing`` to substitute after it runs."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # once, and not for the lookup below
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _substitute(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _OnPackingImport())
