"""vLLM's weight-transfer API for GRPO's rollout process: ``nccl`` on CUDA, ``agentrl_gloo`` on CPU.

The trainer side is :func:`trainer_engine`: ``WeightTransferTrainerFactory.trainer_init`` with
vLLM's ``NCCLTrainerInitInfo`` on CUDA (the world: the trainer's rank 0 and the engine's GPUs) or
this package's gloo backend on CPU, and a :class:`~agentrl.rollout.weight_transfer.WeightSource` of
the trainer's weights wrapped as vLLM's ``WeightSource``. The inference side is the engine built
with ``weight_transfer_config={"backend": ...}`` (:func:`agentrl.rollout.vllm_engine.engine_arguments`),
driven through ``LLM``'s own ``init_weight_transfer_engine`` / ``start_weight_update`` /
``update_weights`` / ``finish_weight_update`` (:class:`agentrl.rollout.vllm_engine.VllmWeightSync`).

vLLM 0.32 has no backend for CPU (nccl and ipc need CUDA: both stop at
``torch.accelerator.current_device_index()``), and its factories take backends at runtime
(``register_engine``), so :func:`register_gloo_backend` adds ``agentrl_gloo`` to both: its worker
side is vLLM's own layerwise reload (``initialize_layerwise_reload`` / ``finalize_layerwise_reload``,
what the nccl worker runs) around a gloo receive, plus the CPU lm_head re-pack. It must be
registered in the process that holds vLLM's worker: the rollout process's engine core runs in that
process on CPU (``in_process``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

from agentrl.rollout import weight_transfer as gloo
from agentrl.rollout.vllm_engine import refresh_cpu_lm_head


def backend_for(device: str) -> str:
    """The weight-transfer backend between a trainer and a vLLM engine on ``device``."""
    return "nccl" if device.startswith("cuda") else gloo.GLOO_BACKEND


@dataclass
class GlooWorkerInitInfo(gloo.GlooInitInfo):
    """vLLM parses the worker's init dict into this (its engines' ``init_info_cls``)."""


@dataclass
class GlooWorkerUpdateInfo(gloo.GlooUpdateInfo):
    """vLLM parses the worker's update dict into this (its engines' ``update_info_cls``)."""


class GlooWorkerEngine(WeightTransferEngine[GlooWorkerInitInfo, GlooWorkerUpdateInfo]):
    """The inference side of ``agentrl_gloo`` inside vLLM's worker."""

    init_info_cls = GlooWorkerInitInfo
    update_info_cls = GlooWorkerUpdateInfo

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.group = None

    def init_transfer_engine(self, init_info: GlooWorkerInitInfo) -> None:
        # the worker's place among all receivers, as vLLM's nccl worker computes it
        parallel = self.parallel_config
        self.group = gloo.join_group(init_info, parallel.data_parallel_index * parallel.world_size + parallel.rank)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info) -> None:
        # vLLM's base method ends with torch.accelerator.synchronize(), which raises without an accelerator
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooWorkerUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("agentrl_gloo weight transfer not initialised: init_weight_transfer_engine first")
        gloo.receive_broadcast(self.group, update_info.specs(), self.model.load_weights, self.model_config.dtype)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        refresh_cpu_lm_head(self.model)  # a tied lm_head is not among the reloaded layers

    def shutdown(self) -> None:
        self.group = None


@dataclass
class GlooVllmTrainerInitInfo(gloo.GlooTrainerInitInfo, TrainerInitInfo):
    """``agentrl_gloo``'s trainer init info as vLLM's factory dispatches it (``backend``)."""


class GlooTrainerEngine(gloo.GlooWeightSender, TrainerWeightTransferEngine):
    """``agentrl_gloo``'s trainer side as a vLLM ``TrainerWeightTransferEngine``."""

    init_info_cls = GlooVllmTrainerInitInfo


def register_gloo_backend() -> None:
    """Add ``agentrl_gloo`` to vLLM's worker and trainer factories (once per process)."""
    if gloo.GLOO_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(gloo.GLOO_BACKEND, GlooWorkerEngine)
    if gloo.GLOO_BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(gloo.GLOO_BACKEND, GlooTrainerEngine)


class VllmWeightSource(WeightSource):
    """A :class:`agentrl.rollout.weight_transfer.WeightSource` as vLLM's ``WeightSource``."""

    def __init__(self, source: gloo.WeightSource) -> None:
        self.source = source

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(s.name, s.dtype, s.shape) for s in self.source.metadata()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.source)


def trainer_engine(
    device: str,
    source: gloo.WeightSource,
    client: gloo.WeightSyncClient | None,
    *,
    rank: int,
    receivers: int,
    timeout_s: float,
    address: str = "127.0.0.1",
) -> TrainerWeightTransferEngine:
    """The trainer's end, through ``WeightTransferTrainerFactory.trainer_init`` (on every trainer
    rank; rank 0 sends): ``receivers`` is the engine's worker count (its GPUs)."""
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    if backend_for(device) == "nccl":
        info = NCCLTrainerInitInfo(address, gloo.free_port(address) if rank == 0 else 0, 1 + receivers, rank=rank)
    else:
        register_gloo_backend()
        info = GlooVllmTrainerInitInfo(address, 1 + receivers, timeout_s, rank=rank)
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=VllmWeightSource(source))
