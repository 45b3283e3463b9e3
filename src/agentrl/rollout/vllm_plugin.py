"""The package's vLLM general plugin: what every process of a vLLM engine needs from agentrl.

vLLM loads its general plugins (the ``vllm.general_plugins`` entry point, pyproject.toml) in each
process of an engine: the caller, the engine core and each worker. Two things must happen there:

- the ``agentrl_gloo`` weight-transfer backend is registered
  (:func:`agentrl.rollout.weight_transfer.register_gloo_backend`), since vLLM's worker, which
  receives the weights, runs in the engine core's process or below it;
- vLLM's own processes (``EngineCore``, ``VllmWorker-<rank>``) end with the process that started
  them. vLLM 0.32 has no watch of its own: an engine core whose rollout process was killed (a
  trainer's ``close()`` after its grace period, a SIGKILL of the rollout process, an OOM kill)
  ran on for ever, holding its memory (on a GPU, the card's). Linux's parent-death signal
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) ends each with its parent, the workers with their
  engine core. The caller's own process is left alone: a stage keeps its own rules for a parent
  that exits (``agentrl.training.parent_watch``).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys

from agentrl.rollout.weight_transfer import register_gloo_backend

VLLM_PROCESS_NAMES = ("EngineCore", "VllmWorker")  # multiprocessing names vLLM 0.32 gives its processes
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def register() -> None:
    """vLLM's entry point: the gloo backend, and vLLM's own processes tied to their parents."""
    register_gloo_backend()
    if multiprocessing.current_process().name.startswith(VLLM_PROCESS_NAMES):
        end_with_parent()


def end_with_parent() -> None:
    """SIGKILL this process when its parent ends (Linux; elsewhere nothing is done)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent ended before the signal was set
        os.kill(os.getpid(), signal.SIGKILL)
