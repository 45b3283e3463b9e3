"""GRPO's rollouts in a process of their own beside the trainer (``grpo.placement: separate``).

Colocated (the default), one process rolls out, then trains, on the same devices, so the trainer
idles through the rollout's long tail and the engine through the update. Separate, a rollout
process holds its own engine, agent loop, sandbox and reward function, and the trainer sends it
requests over a pipe:

- ``rollout k``: roll out and grade step k's groups (:class:`~agentrl.grpo.collection.RolloutCollector`)
  with the newest weights it has loaded; the answer carries the groups, the prompt sampler's
  state after the step (the trainer keeps it for its checkpoints) and the policy version that
  generated them;
- ``weights v``: load version v from the shared-memory copy of the policy (a float32 copy of every
  parameter, made once at start, that the trainer overwrites in place after each update); the
  rollout process answers ``loaded v``, and the trainer never overwrites the copy before that
  answer, so a load never reads half of two versions;
- ``validate``: the validation sets on the loaded weights (``grpo.test_freq``).

The rollout process builds the engine ``rollout.engine`` names from the model folder. ``hf``
loads it with transformers; ``vllm`` is a standalone ``vllm.LLM`` whose engine core runs in the
rollout process itself (``make_engine(..., in_process=True)``), because its ``update_weights``
hands the shared copy's tensors to vLLM's ``reload_weights`` by reference: vLLM's own route
between processes serialises the tensors (and cannot carry them), and its built-in weight-transfer
backends (nccl, ipc) need CUDA. Before a load each tensor is cast to the engine's dtype
(``rollout.dtype``, :func:`agentrl.precision.resolve_dtype`): vLLM's reload takes the tensors a
checkpoint in the model's dtype gives (most of its weight loaders cast as they copy, not every
model's), and the hf engine then copies into its module without a cast.
This is the CPU layout: one trainer process on CPU beside one rollout process
(:func:`agentrl.grpo.trainer.start_rollout_process` refuses any other). The CUDA layout, vLLM
engines on GPUs of their own taking each version over NCCL through vLLM's weight-transfer API, is
not built.

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

import logging
import os
import signal
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.config import Config
from agentrl.errors import StageInterrupted

log = logging.getLogger("agentrl.grpo")

POLL_SECONDS = 0.5  # how often a waiting trainer checks that the rollout process still runs


class RolloutProcessError(StageInterrupted):
    """The rollout process died or failed: the stage stops with this one message (exit 1), and
    rerunning it resumes from the last checkpoint."""


@dataclass
class RolloutResult:
    step: int
    groups: list  # agentrl.grpo.collection.Group, in step order
    timing: dict[str, float]
    sampler_state: dict[str, Any]  # the prompt sampler after this step
    policy_version: int  # the weights that generated the groups: after this many steps


class RolloutProcess:
    """The trainer's end: starts the rollout process, asks for steps, publishes weights.

    ``policy`` is the trainer's module (its parameters are copied once into shared memory),
    ``eval_sets`` the validation sets, ``threads`` the rollout process's torch threads,
    ``total_steps`` the run's last step (nothing is asked beyond it). :meth:`begin` then hands it
    the step to start after and the prompt sampler's state there."""

    def __init__(
        self,
        cfg: Config,
        model_dir: Path,
        train: Path,
        eval_sets: list,
        policy: torch.nn.Module,
        *,
        threads: int,
        total_steps: int,
    ) -> None:
        import torch.multiprocessing as mp

        self.cfg = cfg
        self.total_steps = total_steps
        self.max_staleness = cfg.grpo.max_staleness
        self.weights = {
            name: p.detach().to("cpu", torch.float32, copy=True).share_memory_()
            for name, p in policy.named_parameters()
        }
        context = mp.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(
            target=serve,
            args=(child, cfg, str(model_dir), str(train), eval_sets, self.weights, threads),
            name="agentrl-rollout",
            daemon=True,
        )
        self.process.start()
        child.close()
        self.loaded_version: int | None = None
        self.published_version: int | None = None
        self.next_step: int | None = None
        self._inbox: list[tuple] = []
        self._take("ready", "the rollout process to start")
        log.info(
            "rollout process %d started (%d threads, max_staleness %d)", self.process.pid, threads, self.max_staleness
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
        """The next message of ``kind``: weight acknowledgements are noted on the way, other
        answers kept in order for their own wait."""
        for index, message in enumerate(self._inbox):
            if message[0] == kind:
                return self._inbox.pop(index)
        while True:
            message = self._next(waiting_for)
            if message[0] == "loaded":
                self.loaded_version = message[1]
            if message[0] == kind:
                return message
            if message[0] != "loaded":
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

    # ------------------------------------------------------------------ what the trainer asks
    def begin(self, start: int, sampler_state: dict[str, Any], named_parameters: Iterable) -> None:
        """Start after step ``start`` with the trainer's weights (version ``start``) and sampler state."""
        self.publish(named_parameters, start)
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
        waited = time.perf_counter() - waiting  # what the trainer lost: the rollout not overlapped
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
        return RolloutResult(step, groups, timing, sampler_state, version)

    def _ask(self, step: int) -> None:
        self._send("rollout", step)
        self.next_step = step + 1

    def publish(self, named_parameters: Iterable, version: int) -> None:
        """The trainer's weights as version ``version``: written into the shared copy once the
        rollout process has loaded the previous one, then announced (it loads them before its
        next rollout or validation)."""
        while self.published_version is not None and self.loaded_version != self.published_version:
            self._take("loaded", f"the load of version {self.published_version}")
        with torch.no_grad():
            for name, tensor in named_parameters:
                self.weights[name].copy_(tensor.detach())
        self.published_version = version
        self._send("weights", version)

    def validate(self) -> dict[str, float]:
        """The validation metrics on the newest published weights (loaded before it runs)."""
        self._send("validate")
        return self._take("validated", f"the validation of version {self.published_version}")[1]

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


def serve(connection, cfg: Config, model_dir: str, train: str, eval_sets, weights, threads: int) -> None:
    """The rollout process: build the engine, loop and reward, then answer the trainer's requests."""
    # The cluster's stop signals reach every process of the job: the trainer finishes its step
    # and checkpoints, then closes the pipe, which ends this process. A trainer killed outright
    # closes its end too: the next read or write here fails and the process ends.
    for stop in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(stop, signal.SIG_IGN)
    try:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        _serve(connection, cfg, model_dir, train, eval_sets, weights)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the trainer is gone
    except BaseException:
        try:
            connection.send(("error", traceback.format_exc()))
        finally:
            os._exit(1)


def _serve(connection, cfg: Config, model_dir: str, train: str, eval_sets, weights) -> None:
    from agentrl.grpo.collection import RolloutCollector, rollout_parts
    from agentrl.grpo.prompts import PromptSampler
    from agentrl.grpo.validation import validate
    from agentrl.model.tokenizer import load_chat_tokenizer
    from agentrl.precision import resolve_dtype
    from agentrl.rewards.ground_truth import read_gradable_problems
    from agentrl.rollout import make_engine
    from agentrl.rollout.engine import default_device
    from agentrl.tools.factory import make_sandbox
    from agentrl.training.deepspeed_engine import DistributedContext
    from agentrl.training.seeds import derived_seed

    single = DistributedContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    sampler = PromptSampler(read_gradable_problems(Path(train)), derived_seed(cfg.seed, "grpo-data"))
    with make_sandbox(cfg.sandbox) as sandbox:
        # in_process: a vLLM engine's core in this process, the only place its update_weights can
        # read the shared copy's tensors (the hf engine always is); the seed is colocated rank 0's
        engine = make_engine(cfg.rollout, model_dir, in_process=True, seed=derived_seed(cfg.seed, "grpo-engine", 0))
        engine_dtype = resolve_dtype(cfg.rollout.dtype, default_device())  # the engines' one rule
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
            if kind == "weights":
                # .to is the shared tensor itself when the dtypes agree (float32 on CPU by default)
                engine.update_weights((name, tensor.to(engine_dtype)) for name, tensor in weights.items())
                version = message[1]
                connection.send(("loaded", version))
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
