"""The rollout process's own side (``grpo.placement: separate``): :func:`serve` builds the engine,
agent loop, sandbox and reward function, and answers the trainer's requests over its pipe
(:mod:`agentrl.grpo.rollout_process` is the trainer's side and says what each request does).
With several rollout engines each runs in a rollout process of its own, and they form a gloo
process group apart from the trainer's to share each step's prompts.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import signal
import traceback
from pathlib import Path

import torch

from agentrl.config import Config
from agentrl.training.deepspeed_engine import DistributedContext

TORCHRUN_ENVIRONMENT = (  # the variables torchrun gives a rank (prefixes)
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_",
    "ROLE_",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_",
)


def serve(
    connection,
    cfg: Config,
    model_dir: str,
    train: str,
    eval_sets,
    threads: int,
    *,
    index: int = 0,
    engines: int = 1,
    group_port: int = 0,
) -> None:
    """Rollout process ``index`` of ``engines``: build the engine, loop and reward, then answer the
    trainer's requests (with several, in a gloo process group of their own on ``group_port``)."""
    # The cluster's stop signals reach every process of the job: the trainer finishes its step
    # and checkpoints, then closes the pipe, which ends this process. A trainer killed outright
    # closes its end too: the next read or write here fails and the process ends.
    for stop in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(stop, signal.SIG_IGN)
    # Not a rank of the trainer's job: torchrun's variables (its agent's store above all, which
    # init_process_group would join instead of the rollout processes' own) stay with the trainer.
    for name in [n for n in os.environ if n.startswith(TORCHRUN_ENVIRONMENT)]:
        del os.environ[name]
    try:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        if engines > 1:
            # vLLM's engine core then starts fresh (spawn), outside this process group
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
            torch.distributed.init_process_group(
                "gloo",
                init_method=f"tcp://127.0.0.1:{group_port}",
                rank=index,
                world_size=engines,
                timeout=datetime.timedelta(minutes=cfg.grpo.collective_timeout_minutes),
            )
        _serve(connection, cfg, model_dir, train, eval_sets, index, engines)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the trainer is gone
    except BaseException:
        try:
            connection.send(("error", traceback.format_exc()))
        finally:
            os._exit(1)


def _serve(connection, cfg: Config, model_dir: str, train: str, eval_sets, index: int, engines: int) -> None:
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
    # the collectives among rollout processes are gloo's, on host memory, whatever the engines' device
    ctx = DistributedContext(rank=index, world_size=engines, local_rank=0, device=torch.device("cpu"))
    sampler = PromptSampler(read_gradable_problems(Path(train)), derived_seed(cfg.seed, "grpo-data"))
    with make_sandbox(cfg.sandbox) as sandbox:
        weight_transfer = None
        if cfg.rollout.engine == "vllm":
            from agentrl.rollout.weight_transfer import backend_for

            weight_transfer = backend_for(device)
        # vLLM's engine core in a process of its own, on every device (the branch CUDA needs for its
        # workers): the agentrl_gloo backend reaches it as a vLLM plugin (pyproject's entry point).
        # The seed is colocated rank ``index``'s.
        rollout_cfg = cfg.rollout
        if device == "cuda":  # this process's engine, tensor parallel over the GPUs it was given (often one)
            rollout_cfg = dataclasses.replace(
                rollout_cfg, vllm=dataclasses.replace(rollout_cfg.vllm, tensor_parallel_size=torch.cuda.device_count())
            )
        engine = make_engine(
            rollout_cfg,
            model_dir,
            in_process=False,
            seed=derived_seed(cfg.seed, "grpo-engine", index),
            weight_transfer=weight_transfer,
        )
        weight_sync = engine.weight_sync()
        tokenizer = load_chat_tokenizer(model_dir)
        loop, reward_fn = rollout_parts(cfg, engine, tokenizer, sandbox)
        collector = RolloutCollector(cfg, ctx, loop, reward_fn)
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
                connection.send(("validated", validate(cfg, loop, reward_fn, eval_sets, ctx)))
            else:
                raise ValueError(f"rollout process: unknown request {kind!r}")
