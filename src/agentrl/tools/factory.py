"""Building the sandbox a config names: the one place that knows both backends.

``local`` (:class:`agentrl.tools.sandbox.LocalSandbox`, the worker pool on this machine) and
``sandbox_fusion`` (:mod:`agentrl.tools.sandbox_fusion`, the upstream HTTP service) both implement
:class:`agentrl.tools.sandbox.Sandbox`; each imports only the interface, and this module imports
both, so no arrow between them points back.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from agentrl.config import SandboxConfig
from agentrl.cpus import cpus_per_process
from agentrl.tools.sandbox import LocalSandbox, Sandbox

logger = logging.getLogger("agentrl.tools.sandbox")  # the same logger as the backend's own messages


def make_sandbox(cfg: SandboxConfig) -> Sandbox:
    """The backend ``sandbox.backend`` names: ``local`` or ``sandbox_fusion``.

    ``sandbox.workers: null`` sizes the pool to the CPUs this process of the job has
    (:func:`agentrl.cpus.cpus_per_process`): SLURM's allocation or Snakemake's threads, a
    training rank's share of them under torchrun.
    """
    if cfg.workers is None:
        cfg = dataclasses.replace(cfg, workers=cpus_per_process(os.environ))
        logger.info("sandbox: %d workers (sandbox.workers: null follows the job's CPUs)", cfg.workers)
    if cfg.backend == "local":
        return LocalSandbox(cfg)
    if cfg.backend == "sandbox_fusion":
        from agentrl.tools.sandbox_fusion import SandboxFusionSandbox, probe_service

        probe_service(cfg)  # a URL nothing answers at stops the stage here, naming the key
        return SandboxFusionSandbox(cfg)
    raise ValueError(f"sandbox.backend = {cfg.backend!r} is not one of 'local', 'sandbox_fusion'")
