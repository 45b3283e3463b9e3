"""The ``agentrl_gloo`` weight-transfer backend's classes as vLLM's factories instantiate them.

vLLM 0.32 has no weight-transfer backend for CPU (nccl and ipc need CUDA: both stop at
``torch.accelerator.current_device_index()``), and its factories take backends at runtime
(``register_engine``). :func:`agentrl.rollout.weight_transfer.register_gloo_backend` registers this
module's classes by module path, so vLLM imports it when an engine first asks for the backend;
nothing of this package imports it (it imports vLLM, an optional dependency, at import time,
because its classes subclass vLLM's engine bases). How a policy version reaches an engine is
:mod:`agentrl.rollout.weight_transfer`'s: these classes are its gloo backend in vLLM's types.

The worker side is vLLM's own layerwise reload (``initialize_layerwise_reload`` /
``finalize_layerwise_reload``, what the nccl worker runs) around the gloo receive, plus the CPU
lm_head re-pack; the trainer side is :class:`~agentrl.rollout.weight_transfer.GlooWeightSender`.
"""

from __future__ import annotations

from vllm.distributed.weight_transfer.base import TrainerWeightTransferEngine, WeightTransferEngine

from agentrl.rollout import weight_transfer as gloo


class GlooWorkerEngine(WeightTransferEngine[gloo.GlooInitInfo, gloo.GlooUpdateInfo]):
    """The inference side of ``agentrl_gloo`` inside vLLM's worker (vLLM parses the init and
    update dicts into ``init_info_cls`` and ``update_info_cls``)."""

    init_info_cls = gloo.GlooInitInfo
    update_info_cls = gloo.GlooUpdateInfo

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.group = None

    def init_transfer_engine(self, init_info: gloo.GlooInitInfo) -> None:
        # the worker's place among all receivers, as vLLM's nccl worker computes it
        parallel = self.parallel_config
        self.group = gloo.join_group(init_info, parallel.data_parallel_index * parallel.world_size + parallel.rank)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info) -> None:
        # vLLM's base method ends with torch.accelerator.synchronize(), which raises without an accelerator
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: gloo.GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("agentrl_gloo weight transfer not initialised: init_weight_transfer_engine first")
        gloo.receive_broadcast(self.group, update_info.specs(), self.model.load_weights, self.model_config.dtype)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        gloo.refresh_cpu_lm_head(self.model)  # a tied lm_head is not among the reloaded layers

    def shutdown(self) -> None:
        self.group = None


class GlooTrainerEngine(gloo.GlooWeightSender, TrainerWeightTransferEngine):
    """``agentrl_gloo``'s trainer side as a vLLM ``TrainerWeightTransferEngine`` (the factory
    dispatches on :class:`~agentrl.rollout.weight_transfer.GlooTrainerInitInfo`'s ``backend``)."""

    init_info_cls = gloo.GlooTrainerInitInfo
