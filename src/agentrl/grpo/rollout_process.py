"""GRPO's rollouts in a process of their own beside the trainer (``grpo.placement: separate``).

Colocated (the default), one process rolls out, then trains, on the same devices, so the trainer
idles through the rollout's long tail and the engine through the update. Separate, a rollout
process holds its own engine, agent loop, sandbox and reward function, and the trainer sends it
requests over a pipe:

- ``rollout k``: roll out and grade step k's groups (:class:`~agentrl.grpo.collection.RolloutCollector`)
  with the newest weights it has loaded; the answer carries the groups, the prompt sampler's
  state after the step (the trainer keeps it for its checkpoints) and the policy version that
  generated them;
- weights: each new policy version goes over vLLM's weight-transfer protocol
  (:mod:`agentrl.rollout.weight_transfer`): the trainer's end is built once with
  ``WeightTransferTrainerFactory.trainer_init`` and sends each version with ``send_weights()``; the
  protocol's four inference-side calls travel over the pipe (:class:`PipeWeightSync`) to the
  engine's :meth:`~agentrl.rollout.engine.Engine.weight_sync` in the rollout process, and the
  tensors over the backend's own group: vLLM's ``nccl`` on CUDA, ``agentrl_gloo`` (a gloo broadcast
  registered into vLLM's factories; vLLM has no CPU backend) on CPU and for the hf engine. The
  version label rides ``finish_weight_update``;
- ``validate``: the validation sets on the loaded weights (``grpo.test_freq``).

The rollout process builds the engine ``rollout.engine`` names from the model folder (``hf`` with
transformers; ``vllm`` a ``vllm.LLM`` answering on the weight-transfer backend, its core in the
rollout process on CPU, where the gloo backend is registered). On CUDA the rollout processes run
on the node's last ``grpo.rollout_share`` of GPUs (:func:`agentrl.config.gpu_split`), one engine
per GPU by default (data parallel; ``grpo.rollout_engines`` fewer, each tensor parallel over its
share: :func:`engine_layout`), and the trainer's ranks on the others; on CPU they take
``grpo.rollout_share`` of the CPU threads. Several rollout processes form a gloo process group of
their own and share each step's prompts through the collector's claim queue, as colocated ranks
do. The trainer's rank 0 holds them and every step's groups; the update's redistribution
(:func:`agentrl.grpo.work_sharing.distribute`) gives the other ranks theirs, and every rank joins
each weight push (the ZeRO-3 gathers, :class:`TrainerWeights`).

The process draws the step's prompts itself, from the sampler state it was started with, so it
can run ahead of the trainer. With ``grpo.max_staleness`` s the trainer asks for step k + s's
rollouts as soon as it has step k's, before training step k: with s = 0 the rollouts of step k are
made by the weights after step k - 1 (today's on-policy step), with s = 1 by those after step
k - 2 while step k - 1 trains (one-step-off, as verl's one-step-off-policy trainer and NeMo-RL's).
Policy version v is the weights after v steps; a step's staleness (the version the update starts
from minus the one that generated its rollouts) is logged (``rollout/staleness``) and never
exceeds s (checked on every result).

Faults: a rollout process that dies or raises stops the trainer at its next wait, within a
second, with its exit code or traceback and the rerun that resumes (``RolloutProcessError``); no
step is trained on a partial result. The rollout process ignores the stop signals the cluster
sends the whole job (the trainer finishes its step and checkpoints first) and ends when the
trainer closes the pipe or exits. The checkpoint of step k keeps the rollouts already asked
beyond it (:meth:`RolloutProcess.rollouts_ahead`: under ``max_staleness`` 1, step k + 1's, complete
once version k was pushed, made by version k - 1), and the run resumed from it trains on them
and goes on from there, so a one-step-off run killed anywhere (trainer or rollout process) ends as
the uninterrupted one. Rollouts in flight past the checkpoint are discarded and made again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.config import Config
from agentrl.errors import StageInterrupted
from agentrl.grpo.rollout_server import serve
from agentrl.rollout.weight_transfer import ParamSpec, free_port, trainer_engine
from agentrl.training.deepspeed_engine import DistributedContext

log = logging.getLogger("agentrl.grpo")

POLL_SECONDS = 0.5  # how often a waiting trainer checks that the rollout process still runs


class RolloutProcessError(StageInterrupted):
    """The rollout process died or failed: the stage stops with this one message (exit 1), and
    rerunning it resumes from the last checkpoint."""


@dataclass
class RolloutResult:
    step: int
    groups: list  # agentrl.grpo.collection.Group, in step order (rank 0's; none on the other ranks)
    timing: dict[str, float]
    sampler_state: dict[str, Any]  # the prompt sampler after this step
    policy_version: int  # the weights that generated the groups: after this many steps


class TrainerWeights:
    """The trainer's parameters as the weight source vLLM's trainer engines iterate: full tensors
    in ``named_parameters`` order. Under ZeRO-3 each parameter is gathered for the moment it is
    sent (``deepspeed.zero.GatheredParameters``, a collective: every rank iterates in step), so no
    rank ever holds a second copy of the model."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def metadata(self) -> list[ParamSpec]:
        return [
            ParamSpec(name, p.dtype, tuple(getattr(p, "ds_shape", p.shape)))
            for name, p in self.module.named_parameters()
        ]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, parameter in self.module.named_parameters():
            if hasattr(parameter, "ds_id"):  # a ZeRO-3 partition
                import deepspeed

                with deepspeed.zero.GatheredParameters([parameter]):
                    yield name, parameter.data  # sent before the generator resumes and frees it
            else:
                yield name, parameter.detach()


class PipeWeightSync:
    """vLLM's ``VLLMWeightSyncClient`` over the pipes: each call runs in every rollout process on its
    engine's :meth:`~agentrl.rollout.engine.Engine.weight_sync` and returns when it ended in all of
    them (as vLLM's Ray client fans out to several engines). Engine i's workers take the transfer
    group's ranks ``1 + i * workers_per_engine`` on (the init info's ``rank_offset``; rank 0 is the
    trainer). ``update_weights`` is called on a thread beside the trainer's broadcast (vLLM's
    trainer engines do that), while the trainer's own thread does not read the pipes.
    ``finish_weight_update`` carries :attr:`version` as the label. :attr:`waited_s` adds up the
    time the start of an update waited for the rollout processes to end the rollout they were in."""

    def __init__(self, process: RolloutProcess, workers_per_engine: int) -> None:
        self.process = process
        self.workers_per_engine = workers_per_engine
        self.version: int | None = None
        self.waited_s = 0.0

    def _call(self, method: str, *args) -> None:
        self.process._send_all("weight-sync", method, args)
        self.process._take_all("weight-synced", f"the rollout process's {method}")

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        for child in self.process.children:
            engine_info = {**init_info, "rank_offset": 1 + child.index * self.workers_per_engine}
            self.process._send(child, "weight-sync", "init_weight_transfer_engine", (engine_info,))
        self.process._take_all("weight-synced", "the rollout process's init_weight_transfer_engine")

    def start_weight_update(self) -> None:
        began = time.perf_counter()
        self._call("start_weight_update")
        self.waited_s += time.perf_counter() - began

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._call("update_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._call("finish_weight_update", weight_version if weight_version is not None else str(self.version))


@dataclass
class _Child:
    """One rollout process, its end of the pipe and its answers kept for a later wait."""

    index: int
    process: Any  # multiprocessing.Process
    connection: Any  # multiprocessing.connection.Connection
    inbox: list


def engine_layout(cfg: Config, gpus: list[str] | None) -> list[list[str] | None]:
    """The rollout engines' devices: ``grpo.rollout_engines`` of them (default one per rollout GPU,
    or one on CPU), the rollout GPUs split evenly between them (each engine tensor parallel over its
    share), or none on CPU."""
    from agentrl.config import ConfigError

    count = cfg.grpo.rollout_engines
    if not gpus:
        if (count or 1) > 1 and cfg.rollout.engine == "vllm":
            raise ConfigError(
                f"grpo.rollout_engines = {count} with rollout.engine: vllm on CPU: vLLM-CPU takes its weights "
                "in the rollout process's own engine core, one per process group; use one engine, or the hf engine"
            )
        return [None] * (count or 1)
    count = count or len(gpus)
    if len(gpus) % count:
        raise ConfigError(
            f"grpo.rollout_engines = {count} does not divide the {len(gpus)} rollout GPUs (grpo.rollout_share); "
            "each engine is tensor parallel over an equal share"
        )
    size = len(gpus) // count
    return [gpus[i * size : (i + 1) * size] for i in range(count)]


class RolloutProcess:
    """The trainer's end, on rank 0: starts the rollout processes, asks for steps, sends weights.

    ``source`` is the trainer's weights (:class:`TrainerWeights`), ``eval_sets`` the validation
    sets, ``threads`` the rollout processes' torch threads (split between them), ``gpus`` their
    devices (ids for ``CUDA_VISIBLE_DEVICES``; none on CPU), ``total_steps`` the run's last step
    (nothing is asked beyond it). With several engines (:func:`engine_layout`) the rollout
    processes form a gloo process group of their own and share each step's prompts through
    :class:`~agentrl.grpo.collection.RolloutCollector`'s claim queue, as the colocated ranks do;
    the trainer takes the union of their groups. :meth:`begin` then hands them the step to start
    after and the prompt sampler's state there. The other trainer ranks hold a :class:`RolloutPeer`."""

    def __init__(
        self,
        cfg: Config,
        model_dir: Path,
        train: Path,
        eval_sets: list,
        source: TrainerWeights,
        ctx: DistributedContext,
        *,
        threads: int,
        total_steps: int,
        gpus: list[str] | None = None,
    ) -> None:
        import torch.multiprocessing as mp

        self.cfg = cfg
        self.ctx = ctx
        self.total_steps = total_steps
        self.max_staleness = cfg.grpo.max_staleness
        layout = engine_layout(cfg, gpus)
        engines = len(layout)
        # the rollout processes' own process group (their claim queue and collectives), apart from
        # the trainer's; the trainer only picks its port
        group_port = free_port("127.0.0.1") if engines > 1 else 0
        context = mp.get_context("spawn")
        self.children: list[_Child] = []
        try:
            self._start(context, cfg, model_dir, train, eval_sets, threads, layout, group_port)
            self.next_step: int | None = None
            self._take_all("ready", "the rollout process to start")
            workers_per_engine = len(layout[0] or ()) or 1
            self.client = PipeWeightSync(self, workers_per_engine)
            self.sender = self._guarded(
                "the weight-transfer rendezvous",
                lambda: trainer_engine(
                    cfg.rollout.engine,
                    ctx.device.type,
                    source,
                    self.client,
                    rank=0,
                    receivers=engines * workers_per_engine,
                    timeout_s=cfg.grpo.collective_timeout_minutes * 60,
                ),
            )
        except BaseException:
            self.close()  # not daemonic: a child left running would hold the trainer's exit
            raise
        log.info(
            "%d rollout process(es) %s started (%s, max_staleness %d)",
            engines,
            ",".join(str(c.process.pid) for c in self.children),
            "GPUs " + " | ".join(",".join(d) for d in layout) if gpus else f"{max(1, threads // engines)} threads each",
            self.max_staleness,
        )

    def _start(self, context, cfg: Config, model_dir, train, eval_sets, threads: int, layout, group_port: int) -> None:
        """Start one rollout process per engine of ``layout``.

        Not daemonic: on CUDA the process builds vLLM with its engine core in a process of its own
        (and, tensor parallel, its workers), and Python refuses children to a daemonic process.
        :meth:`close` stops them however the stage ends (the trainer holds this object in an exit
        stack), and each ends by itself when the trainer's end of its pipe closes.
        """
        engines = len(layout)
        for index, devices in enumerate(layout):
            connection, child = context.Pipe()
            process = context.Process(
                target=serve,
                args=(child, cfg, str(model_dir), str(train), eval_sets, max(1, threads // engines)),
                kwargs={"index": index, "engines": engines, "group_port": group_port},
                name=f"agentrl-rollout-{index}",
                daemon=False,
            )
            with visible_devices(devices):  # a spawned child reads its environment when it starts
                process.start()
            child.close()
            self.children.append(_Child(index, process, connection, []))

    # ------------------------------------------------------------------ pipes
    def _send(self, child: _Child, *message) -> None:
        try:
            child.connection.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError) as error:
            raise self._failure(child, f"sending {message[0]!r}") from error

    def _send_all(self, *message) -> None:
        for child in self.children:
            self._send(child, *message)

    def _next(self, child: _Child, waiting_for: str) -> tuple:
        """``child``'s next message, checking every ``POLL_SECONDS`` that every rollout process still
        runs (one blocked in a collective with a dead one would wait for it)."""
        while not child.connection.poll(POLL_SECONDS):
            for each in self.children:
                if not each.process.is_alive():
                    raise self._failure(each, waiting_for)
        try:
            message = child.connection.recv()
        except (EOFError, ConnectionResetError) as error:
            raise self._failure(child, waiting_for) from error
        if message[0] == "error":
            raise RolloutProcessError(
                f"the rollout process (pid {child.process.pid}) failed while the trainer waited for {waiting_for}:"
                f"\n{message[1]}\nThe stage stops; rerunning it resumes from the last checkpoint."
            )
        return message

    def _take(self, child: _Child, kind: str, waiting_for: str) -> tuple:
        """``child``'s next message of ``kind``; others are kept in order for their own wait."""
        for index, message in enumerate(child.inbox):
            if message[0] == kind:
                return child.inbox.pop(index)
        while True:
            message = self._next(child, waiting_for)
            if message[0] == kind:
                return message
            child.inbox.append(message)

    def _take_all(self, kind: str, waiting_for: str) -> list[tuple]:
        return [self._take(child, kind, waiting_for) for child in self.children]

    def _failure(self, child: _Child, waiting_for: str) -> RolloutProcessError:
        child.process.join(timeout=5)
        code = child.process.exitcode
        how = f"exited with code {code}" if code is not None and code >= 0 else f"was killed by signal {-(code or 0)}"
        return RolloutProcessError(
            f"the rollout process (pid {child.process.pid}) {how} while the trainer waited for {waiting_for} "
            "(grpo.placement: separate); the stage stops and its rollouts in flight are lost. Rerunning the "
            "stage resumes from the last checkpoint."
        )

    def _guarded(self, what: str, transfer):
        """``transfer()``; a rollout process that died during it (the group's collective then
        fails on the trainer's side) is reported as such."""
        try:
            return transfer()
        except RolloutProcessError:
            raise
        except Exception as error:
            for child in self.children:
                if not child.process.is_alive():
                    raise self._failure(child, what) from error
            raise

    # ------------------------------------------------------------------ what the trainer asks
    def begin(self, start: int, sampler_state: dict[str, Any], ahead: list[list[tuple]] = ()) -> None:
        """Start after step ``start`` with the trainer's weights (version ``start``) and sampler state.

        ``ahead``: the answers of the steps after ``start`` that the checkpoint of step ``start``
        kept (:meth:`rollouts_ahead`, each engine's): they are answered as they were, and the rollout
        processes go on after them, from the sampler state the last one left, so a resumed
        one-step-off run trains on the rollouts of the uninterrupted one.
        """
        self.publish(start)
        if ahead and len(ahead[0]) != len(self.children):
            log.warning(
                "the checkpoint of step %d kept the rollouts of %d engine(s), this run has %d: they roll out again",
                start,
                len(ahead[0]),
                len(self.children),
            )
            ahead = ()
        first = start + 1
        for answers in ahead:
            assert all(a[0] == "rolled" and a[1] == first for a in answers), f"kept answers not of step {first}"
            for child, answer in zip(self.children, answers):
                child.inbox.append(answer)
            sampler_state, first = answers[0][4], first + 1
        self._send_all("sampler", sampler_state, first)
        self.next_step = first

    def rollouts_ahead(self, step: int) -> list[list[tuple]]:
        """The answers of the steps asked beyond ``step`` (up to ``grpo.max_staleness``), each
        engine's, waited for and kept for :meth:`rollouts`: what the checkpoint of step ``step``
        holds so that the run resumed from it trains on the same rollouts (:meth:`begin`). With
        ``max_staleness`` 1 step ``step + 1``'s are already here: the push of version ``step``
        waited for the rollout that made them."""
        ahead = [
            [self._take(child, "rolled", f"step {later}'s rollouts") for child in self.children]
            for later in range(step + 1, self.next_step or step + 1)
        ]
        for index, child in enumerate(self.children):
            child.inbox[:0] = [answers[index] for answers in ahead]
        return ahead

    def rollouts(self, step: int) -> RolloutResult:
        """Step ``step``'s graded groups (every engine's, in step order); asks for the following
        steps up to ``max_staleness`` ahead before returning, so they roll out while this one trains."""
        assert self.next_step is not None, "begin() first"
        while self.next_step <= min(step, self.total_steps):
            self._ask(self.next_step)
        waiting = time.perf_counter()
        answers = self._take_all("rolled", f"step {step}'s rollouts")
        # what the trainer lost to the rollout: this wait, and the starts of weight pushes that
        # waited for the rollout processes to end a rollout
        waited = time.perf_counter() - waiting + self.client.waited_s
        self.client.waited_s = 0.0
        assert all(a[1] == step for a in answers), f"rollout processes answered {[a[1] for a in answers]}, not {step}"
        version = answers[0][5]
        assert all(a[5] == version for a in answers), f"the engines held versions {[a[5] for a in answers]}"
        staleness = (step - 1) - version
        if not 0 <= staleness <= self.max_staleness:
            raise RolloutProcessError(
                f"step {step}'s rollouts came from policy version {version}, {staleness} behind the trainer's "
                f"{step - 1}: outside grpo.max_staleness = {self.max_staleness}"
            )
        while self.next_step <= min(step + self.max_staleness, self.total_steps):
            self._ask(self.next_step)
        groups = sorted((g for a in answers for g in a[2]), key=lambda g: g.key)
        # the engines' metrics are all-reduced among them; their own times differ: the slowest counts
        timing = dict(answers[0][3])
        for key in timing:
            if key.startswith("timing/"):
                timing[key] = max(a[3][key] for a in answers)
        timing |= {"timing/rollout_wait_s": waited, "rollout/staleness": float(staleness)}
        sampler_state = answers[0][4]
        share_with_peers(self.ctx, (timing, sampler_state, version))
        return RolloutResult(step, groups, timing, sampler_state, version)

    def _ask(self, step: int) -> None:
        self._send_all("rollout", step)
        self.next_step = step + 1

    def publish(self, version: int) -> None:
        """The trainer's weights as version ``version``, through the weight-transfer engine (every
        trainer rank joins: :meth:`RolloutPeer.publish`). The rollout processes load them when they
        are between rollouts, so this returns once they have ended the one they were in."""
        self.client.version = version
        self._guarded(f"the push of policy version {version}", self.sender.send_weights)

    def validate(self) -> dict[str, float]:
        """The validation metrics on the newest published weights (every trainer rank gets them)."""
        self._send_all("validate")
        metrics = self._take_all("validated", f"the validation of version {self.client.version}")[0][1]
        share_with_peers(self.ctx, metrics)
        return metrics

    def close(self) -> None:
        """Stop the rollout processes (in-flight rollouts are discarded)."""
        for child in self.children:
            if child.process.is_alive():
                try:
                    child.connection.send(("stop",))
                except (BrokenPipeError, ConnectionResetError, OSError):
                    pass
        for child in self.children:
            child.process.join(timeout=10)
            if child.process.is_alive():
                child.process.kill()
                child.process.join(timeout=5)
            child.connection.close()


class RolloutPeer:
    """A trainer rank other than 0 beside the rollout process: the same calls as
    :class:`RolloutProcess`, answered by rank 0 (no groups: the update's redistribution brings this
    rank its samples), and its part of every weight push."""

    def __init__(self, cfg: Config, source: TrainerWeights, ctx: DistributedContext, gpus: list[str] | None) -> None:
        self.ctx = ctx
        layout = engine_layout(cfg, gpus)
        self.sender = trainer_engine(
            cfg.rollout.engine,
            ctx.device.type,
            source,
            None,
            rank=ctx.rank,
            receivers=len(layout) * (len(layout[0] or ()) or 1),
            timeout_s=cfg.grpo.collective_timeout_minutes * 60,
        )

    def begin(self, start: int, sampler_state: dict[str, Any], ahead: list[list[tuple]] = ()) -> None:
        self.publish(start)

    def rollouts_ahead(self, step: int) -> list[list[tuple]]:
        return []  # rank 0 keeps them

    def rollouts(self, step: int) -> RolloutResult:
        timing, sampler_state, version = share_with_peers(self.ctx, None)
        return RolloutResult(step, [], timing, sampler_state, version)

    def publish(self, version: int) -> None:
        self.sender.send_weights()

    def validate(self) -> dict[str, float]:
        return share_with_peers(self.ctx, None)

    def close(self) -> None:
        pass


def rollout_gpus(cfg: Config, ctx: DistributedContext, env) -> list[str]:
    """The rollout process's GPUs: the node's last ones (``CUDA_VISIBLE_DEVICES`` ids, else
    indices), after the trainer's ranks, which hold the first ``world_size`` (one node only)."""
    from agentrl.config import ConfigError, gpu_split

    rollout_share = cfg.grpo.rollout_share
    visible = env.get("CUDA_VISIBLE_DEVICES")
    ids = (
        [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
        if visible is not None
        else [str(i) for i in range(torch.cuda.device_count())]
    )
    trainers, rollout = gpu_split(len(ids), rollout_share) if ids else (0, 0)
    if ctx.world_size != trainers:
        raise ConfigError(
            f"grpo.placement: separate on {len(ids)} GPU(s) of one node: grpo.rollout_share = {rollout_share} "
            f"leaves {trainers} to the trainer, but {ctx.world_size} trainer process(es) run (the stage starts "
            "that many itself from --nproc; one node only, with the rollout engine beside the trainer)"
        )
    if len(ids) == 1 and cfg.rollout.engine == "vllm":
        raise ConfigError(
            "grpo.placement: separate with rollout.engine: vllm on one GPU: vLLM's weight transfer is NCCL there, "
            "which connects no two processes on one device; give the job two GPUs or more, or use rollout.engine: hf"
        )
    return ids[-rollout:]


def share_with_peers(ctx: DistributedContext, value):
    """Rank 0's ``value`` on every rank."""
    if ctx.world_size == 1:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def visible_devices(gpus: list[str] | None):
    """``CUDA_VISIBLE_DEVICES`` set to ``gpus`` while a child process starts (unchanged without)."""
    if not gpus:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
