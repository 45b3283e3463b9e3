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
rollout process on CPU, where the gloo backend is registered). On CUDA it runs on the job's last
``grpo.rollout_share`` of the node's GPUs (:func:`agentrl.config.gpu_split`), one engine tensor-parallel over them,
and the trainer's ranks on the others; on CPU it takes ``grpo.rollout_share`` of the CPU threads.
The trainer's rank 0 holds the rollout process and every step's groups; the update's
redistribution (:func:`agentrl.grpo.work_sharing.distribute`) gives the other ranks theirs, and
every rank joins each weight push (the ZeRO-3 gathers, :class:`TrainerWeights`).

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
trainer closes the pipe or exits. Rollouts in flight at a stop or crash are discarded: the
resumed run rolls out step k + 1 again from the checkpoint of step k, with the checkpoint's
weights, so under ``max_staleness`` 1 its first step is on-policy where the uninterrupted run's
was one step off (the trajectories differ; staleness is in the run fingerprint).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.config import Config
from agentrl.errors import StageInterrupted
from agentrl.rollout.weight_transfer import ParamSpec, trainer_engine
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
    """vLLM's ``VLLMWeightSyncClient`` over the pipe: each call runs in the rollout process on its
    engine's :meth:`~agentrl.rollout.engine.Engine.weight_sync` and returns when it ended there.
    ``update_weights`` is called on a thread beside the trainer's broadcast (vLLM's trainer engines
    do that), while the trainer's own thread does not read the pipe. ``finish_weight_update``
    carries :attr:`version` as the label. :attr:`waited_s` adds up the time the start of an update
    waited for the rollout process to end the rollout it was in."""

    def __init__(self, process: RolloutProcess) -> None:
        self.process = process
        self.version: int | None = None
        self.waited_s = 0.0

    def _call(self, method: str, *args) -> None:
        self.process._send("weight-sync", method, args)
        self.process._take("weight-synced", f"the rollout process's {method}")

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._call("init_weight_transfer_engine", init_info)

    def start_weight_update(self) -> None:
        began = time.perf_counter()
        self._call("start_weight_update")
        self.waited_s += time.perf_counter() - began

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._call("update_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._call("finish_weight_update", weight_version if weight_version is not None else str(self.version))


class RolloutProcess:
    """The trainer's end, on rank 0: starts the rollout process, asks for steps, sends weights.

    ``source`` is the trainer's weights (:class:`TrainerWeights`), ``eval_sets`` the validation
    sets, ``threads`` the rollout process's torch threads, ``gpus`` the devices it runs on (their
    ids for ``CUDA_VISIBLE_DEVICES``; none on CPU), ``total_steps`` the run's last step (nothing is
    asked beyond it). :meth:`begin` then hands it the step to start after and the prompt
    sampler's state there. The other ranks hold a :class:`RolloutPeer`."""

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
        context = mp.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(
            target=serve,
            args=(child, cfg, str(model_dir), str(train), eval_sets, threads),
            name="agentrl-rollout",
            daemon=True,
        )
        with visible_devices(gpus):  # a spawned child reads its environment when it starts
            self.process.start()
        child.close()
        self.next_step: int | None = None
        self._inbox: list[tuple] = []
        self._take("ready", "the rollout process to start")
        self.client = PipeWeightSync(self)
        self.sender = self._guarded(
            "the weight-transfer rendezvous",
            lambda: trainer_engine(
                cfg.rollout.engine,
                ctx.device.type,
                source,
                self.client,
                rank=0,
                receivers=max(len(gpus or ()), 1),
                timeout_s=cfg.grpo.collective_timeout_minutes * 60,
            ),
        )
        log.info(
            "rollout process %d started (%s, max_staleness %d)",
            self.process.pid,
            f"GPUs {','.join(gpus)}" if gpus else f"{threads} threads",
            self.max_staleness,
        )

    # ------------------------------------------------------------------ pipe
    def _send(self, *message) -> None:
        try:
            self.connection.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError) as error:
            raise self._failure(f"sending {message[0]!r}") from error

    def _next(self, waiting_for: str) -> tuple:
        """The next message, checking every ``POLL_SECONDS`` that the process still runs."""
        while not self.connection.poll(POLL_SECONDS):
            if not self.process.is_alive():
                raise self._failure(waiting_for)
        try:
            message = self.connection.recv()
        except (EOFError, ConnectionResetError) as error:
            raise self._failure(waiting_for) from error
        if message[0] == "error":
            raise RolloutProcessError(
                f"the rollout process failed while the trainer waited for {waiting_for}:\n{message[1]}"
                "\nThe stage stops; rerunning it resumes from the last checkpoint."
            )
        return message

    def _take(self, kind: str, waiting_for: str) -> tuple:
        """The next message of ``kind``; others are kept in order for their own wait."""
        for index, message in enumerate(self._inbox):
            if message[0] == kind:
                return self._inbox.pop(index)
        while True:
            message = self._next(waiting_for)
            if message[0] == kind:
                return message
            self._inbox.append(message)

    def _failure(self, waiting_for: str) -> RolloutProcessError:
        self.process.join(timeout=5)
        code = self.process.exitcode
        how = f"exited with code {code}" if code is not None and code >= 0 else f"was killed by signal {-(code or 0)}"
        return RolloutProcessError(
            f"the rollout process (pid {self.process.pid}) {how} while the trainer waited for {waiting_for} "
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
            if not self.process.is_alive():
                raise self._failure(what) from error
            raise

    # ------------------------------------------------------------------ what the trainer asks
    def begin(self, start: int, sampler_state: dict[str, Any]) -> None:
        """Start after step ``start`` with the trainer's weights (version ``start``) and sampler state."""
        self.publish(start)
        self._send("sampler", sampler_state, start + 1)
        self.next_step = start + 1

    def rollouts(self, step: int) -> RolloutResult:
        """Step ``step``'s graded groups; asks for the following steps up to ``max_staleness`` ahead
        before returning, so they roll out while this one trains."""
        assert self.next_step is not None, "begin() first"
        while self.next_step <= min(step, self.total_steps):
            self._ask(self.next_step)
        waiting = time.perf_counter()
        _, answered, groups, timing, sampler_state, version = self._take("rolled", f"step {step}'s rollouts")
        # what the trainer lost to the rollout: this wait, and the starts of weight pushes that
        # waited for the rollout process to end a rollout
        waited = time.perf_counter() - waiting + self.client.waited_s
        self.client.waited_s = 0.0
        assert answered == step, f"rollout process answered step {answered}, the trainer waits for {step}"
        staleness = (step - 1) - version
        if not 0 <= staleness <= self.max_staleness:
            raise RolloutProcessError(
                f"step {step}'s rollouts came from policy version {version}, {staleness} behind the trainer's "
                f"{step - 1}: outside grpo.max_staleness = {self.max_staleness}"
            )
        while self.next_step <= min(step + self.max_staleness, self.total_steps):
            self._ask(self.next_step)
        timing = {**timing, "timing/rollout_wait_s": waited, "rollout/staleness": float(staleness)}
        share_with_peers(self.ctx, (timing, sampler_state, version))
        return RolloutResult(step, groups, timing, sampler_state, version)

    def _ask(self, step: int) -> None:
        self._send("rollout", step)
        self.next_step = step + 1

    def publish(self, version: int) -> None:
        """The trainer's weights as version ``version``, through the weight-transfer engine (every
        rank joins: :meth:`RolloutPeer.publish`). The rollout process loads them when it is
        between rollouts, so this returns once it has ended the one it was in."""
        self.client.version = version
        self._guarded(f"the push of policy version {version}", self.sender.send_weights)

    def validate(self) -> dict[str, float]:
        """The validation metrics on the newest published weights (every rank gets them)."""
        self._send("validate")
        metrics = self._take("validated", f"the validation of version {self.client.version}")[1]
        share_with_peers(self.ctx, metrics)
        return metrics

    def close(self) -> None:
        """Stop the rollout process (in-flight rollouts are discarded)."""
        if self.process.is_alive():
            try:
                self.connection.send(("stop",))
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass
            self.process.join(timeout=10)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(timeout=5)
        self.connection.close()


class RolloutPeer:
    """A trainer rank other than 0 beside the rollout process: the same calls as
    :class:`RolloutProcess`, answered by rank 0 (no groups: the update's redistribution brings this
    rank its samples), and its part of every weight push."""

    def __init__(self, cfg: Config, source: TrainerWeights, ctx: DistributedContext, gpus: list[str] | None) -> None:
        self.ctx = ctx
        self.sender = trainer_engine(
            cfg.rollout.engine,
            ctx.device.type,
            source,
            None,
            rank=ctx.rank,
            receivers=max(len(gpus or ()), 1),
            timeout_s=cfg.grpo.collective_timeout_minutes * 60,
        )

    def begin(self, start: int, sampler_state: dict[str, Any]) -> None:
        self.publish(start)

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


def serve(connection, cfg: Config, model_dir: str, train: str, eval_sets, threads: int) -> None:
    """The rollout process: build the engine, loop and reward, then answer the trainer's requests."""
    # The cluster's stop signals reach every process of the job: the trainer finishes its step
    # and checkpoints, then closes the pipe, which ends this process. A trainer killed outright
    # closes its end too: the next read or write here fails and the process ends.
    for stop in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(stop, signal.SIG_IGN)
    try:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        _serve(connection, cfg, model_dir, train, eval_sets)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the trainer is gone
    except BaseException:
        try:
            connection.send(("error", traceback.format_exc()))
        finally:
            os._exit(1)


def _serve(connection, cfg: Config, model_dir: str, train: str, eval_sets) -> None:
    from agentrl.grpo.collection import RolloutCollector, rollout_parts
    from agentrl.grpo.prompts import PromptSampler
    from agentrl.grpo.validation import validate
    from agentrl.model.tokenizer import load_chat_tokenizer
    from agentrl.rewards.ground_truth import read_gradable_problems
    from agentrl.rollout import make_engine
    from agentrl.rollout.engine import default_device
    from agentrl.tools.factory import make_sandbox
    from agentrl.training.seeds import derived_seed

    device = default_device()
    single = DistributedContext(rank=0, world_size=1, local_rank=0, device=torch.device(device))
    sampler = PromptSampler(read_gradable_problems(Path(train)), derived_seed(cfg.seed, "grpo-data"))
    with make_sandbox(cfg.sandbox) as sandbox:
        weight_transfer = None
        if cfg.rollout.engine == "vllm":
            from agentrl.rollout.vllm_weight_transfer import backend_for

            weight_transfer = backend_for(device)
        # CPU: the vLLM engine's core in this process, where the gloo backend is registered (the
        # hf engine always is); the seed is colocated rank 0's
        rollout_cfg = cfg.rollout
        if device == "cuda":  # one engine, tensor parallel over the GPUs this process was given
            rollout_cfg = dataclasses.replace(
                rollout_cfg, vllm=dataclasses.replace(rollout_cfg.vllm, tensor_parallel_size=torch.cuda.device_count())
            )
        engine = make_engine(
            rollout_cfg,
            model_dir,
            in_process=device == "cpu",
            seed=derived_seed(cfg.seed, "grpo-engine", 0),
            weight_transfer=weight_transfer,
        )
        weight_sync = engine.weight_sync()
        tokenizer = load_chat_tokenizer(model_dir)
        loop, reward_fn = rollout_parts(cfg, engine, tokenizer, sandbox)
        collector = RolloutCollector(cfg, single, loop, reward_fn)
        version = None
        next_step = None
        connection.send(("ready",))
        while True:
            message = connection.recv()
            kind = message[0]
            if kind == "stop":
                return
            if kind == "weight-sync":
                _, method, args = message
                getattr(weight_sync, method)(*args)
                if method == "finish_weight_update":
                    version = int(args[0])
                connection.send(("weight-synced", method))
            elif kind == "sampler":
                sampler.load_state_dict(message[1])
                next_step = message[2]
            elif kind == "rollout":
                step = message[1]
                assert step == next_step, f"asked for step {step}, the sampler is at step {next_step}"
                groups, timing = collector.collect(step, sampler)
                connection.send(("rolled", step, groups, timing, sampler.state_dict(), version))
                next_step = step + 1
            elif kind == "validate":
                connection.send(("validated", validate(cfg, loop, reward_fn, eval_sets, single)))
            else:
                raise ValueError(f"rollout process: unknown request {kind!r}")
