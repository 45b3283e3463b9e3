"""The actor's forward for GRPO: per-token log-probs (and entropies) of the response tokens only.

:class:`ResponseLogProbs` wraps a Hugging Face causal LM; it is the module DeepSpeed trains, so
``engine(micro_batch)`` is the whole forward and the rollout engine shares ``.model`` (the same
parameter tensors). The transformer runs once over ``prompt + response``; the vocabulary
projection runs only at the positions that predict response tokens, in chunks of
``grpo.logit_chunk_tokens`` positions, each under activation checkpointing when gradients are
needed: the ``(tokens, vocabulary)`` logits then never exist at once (a 20k-token response of
a 150k-vocabulary model would need ~12 GB for them in float32), and the backward recomputes
one chunk at a time. Log-probs use the sampling temperature (``logits / T``), as verl's actor,
so that ``old_logp`` and the engine's sampling log-probs describe the same distribution.

A micro-batch with :class:`~agentrl.grpo.batching.SharedPrompts` (``grpo.share_prompts``) runs
each distinct prompt once, with a KV cache, and the responses over that cache, the prompt's keys
and values indexed out to each row of its group (a differentiable gather, so the gradient of every
response reaches the prompt's positions): the same function of the weights as the full forward,
computed ``n - 1`` prompt lengths shorter per group. The responses take explicit positions
(prompt length + k), and the prompts' padding is masked, so prompts of different lengths share it.

:func:`old_logprobs_source` decides whether the update's old log-probs need this forward at
all, or are the engine's sampling log-probs (``grpo.old_logprobs``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from agentrl.grpo.algorithm import blockwise_entropy, entropy_from_logits, sampled_token_logprobs
from agentrl.grpo.batching import MicroBatch
from agentrl.training.collectives import max_over_ranks
from agentrl.training.lora import hf_weights
from agentrl.training.packing import enable_packed_attention

if TYPE_CHECKING:
    from agentrl.config import RolloutConfig


def old_logprobs_source(
    mode: Literal["auto", "recompute", "engine"],
    rollout: RolloutConfig,
    policy_dtype: torch.dtype,
    max_staleness: int = 0,
) -> Literal["recompute", "engine"]:
    """Where the update's old log-probs come from (``grpo.old_logprobs``); ``auto`` resolved.

    The clipped ratio is ``r_t = pi_theta(y_t | y_<t) / pi_old(y_t | y_<t)`` with, in the
    actor's forward, ``log pi(y_t) = log_softmax(z_t / T)[y_t]`` (``z`` the model's logits, ``T``
    ``rollout.temperature``, as verl). The engine returns ``log q(y_t)`` of the distribution it
    sampled from: ``log_softmax(filter_{k,p}(z_t / T))[y_t]`` (top-k, then top-p). So
    ``q = pi_old`` - the engine's log-probs *are* the old log-probs, and the recomputation pass
    buys nothing - exactly when

    - the filters are off (``top_p == 1``, ``top_k`` off): else ``q`` renormalises over the
      nucleus and ``log q >= log pi_old`` on every sampled token (a biased ratio);
    - ``T > 0`` (the same ``T`` on both sides by construction; greedy has no distribution);
    - the engine computes the logits with the actor's own weights and numerics: the ``hf``
      engine shares the actor's module, so in float32 the two differ only by the order of float
      operations (KV-cached left-padded decoding vs one right-padded forward; ~4e-7 measured). In
      bf16 that noise is ~1e-2, and vLLM has its own kernels (and bf16), so both recompute, as
      upstream verl does.

    - the rollouts are on-policy (``grpo.max_staleness`` 0): stale ones were sampled by older
      weights, and the update's ratio is to the weights it starts from (decoupled PPO).

    ``auto`` picks ``engine`` in exactly those cases, else ``recompute``; ``engine`` and
    ``recompute`` force one (``engine`` with filters on trains on a biased ratio: for
    experiments only). ``policy_dtype`` is the dtype of the actor's parameters (what the shared
    module computes in, ``grpo.deepspeed.dtype`` resolved); ``rollout.dtype`` does not apply to
    an engine that shares the module.
    """
    if mode != "auto":
        return mode
    exact = (
        rollout.engine == "hf"
        and policy_dtype == torch.float32
        and rollout.temperature > 0
        and rollout.top_p == 1.0
        and rollout.top_k <= 0  # -1 (and vLLM's 0) = off
        and max_staleness == 0
    )
    return "engine" if exact else "recompute"


class ResponseLogProbs(nn.Module):
    """``forward(batch) -> (logp (B, R), entropy (B, R) or None)`` for a :class:`MicroBatch`.

    ``model`` is a Hugging Face causal LM or PEFT's LoRA wrapper of one (``grpo.lora``): the
    forward reaches the transformer through ``get_decoder()``, which PEFT forwards to the model
    inside (its ``base_model`` is PEFT's own tuner, not the transformer)."""

    def __init__(self, model: nn.Module, *, logit_chunk_tokens: int, temperature: float) -> None:
        super().__init__()
        assert logit_chunk_tokens >= 1, f"logit_chunk_tokens must be >= 1, got {logit_chunk_tokens}"
        assert temperature > 0, f"the log-prob temperature must be positive, got {temperature}"
        self.model = model
        self.logit_chunk_tokens = logit_chunk_tokens
        self.temperature = temperature

    def forward(self, batch: MicroBatch, with_entropy: bool = False, entropy_grad: bool = False):
        """``(logp (B, R), entropy (B, R) or None)``, computed at the loss-mask positions only.

        Every loss term and statistic reads these values through the loss mask, so the
        vocabulary projection runs on ``N = sum(loss_mask)`` positions, not on the ``B x R``
        response frame (tool responses, template tokens and the frame's padding are skipped);
        the other positions of the frame hold 0. A micro-batch without a loss token (a rank's
        padding micro-batch) projects one position, whose zero-weighted loss still gives every
        parameter its (zero) gradient, as DeepSpeed's reduction expects. Every rank runs the
        chunk count of the rank with the most (:func:`max_over_ranks`), as SFT's loss does: under
        ZeRO-3 a rank with fewer chunks would otherwise leave the others waiting in a weight gather.
        """
        selected = batch.loss_mask.bool()  # (B, R)
        if not selected.any():
            selected = selected.clone()
            selected[0, 0] = True
        if batch.shared is not None:
            states, labels = self._shared_prompt_states(batch)
            states, labels = states[selected], labels[selected]  # (N, H), (N,)
        else:
            states, labels = self._row_states(batch, selected)
        # Under ZeRO-3 each projection call gathers the partitioned weight (a collective): every
        # rank runs as many chunks as the rank with the most, extra ones on its first position,
        # weighted 0 (their backward recomputes the projection too, so it must reach the loss).
        chunks = max_over_ranks(max(1, math.ceil(states.shape[0] / self.logit_chunk_tokens)), states.device)
        logps, entropies, unused = [], [], states.new_zeros((), dtype=torch.float32)
        for start in range(0, chunks * self.logit_chunk_tokens, self.logit_chunk_tokens):
            chunk = slice(start, start + self.logit_chunk_tokens)
            chunk_states, chunk_labels = states[chunk], labels[chunk]
            padding = chunk_states.shape[0] == 0
            if padding:
                chunk_states, chunk_labels = states[:1], labels[:1]
            if torch.is_grad_enabled():
                logp, entropy = checkpoint(
                    self._chunk, chunk_states, chunk_labels, with_entropy, entropy_grad, use_reentrant=False
                )
            else:
                logp, entropy = self._chunk(chunk_states, chunk_labels, with_entropy, entropy_grad)
            if padding:
                unused = unused + 0.0 * logp.sum() + (0.0 * entropy.sum() if entropy is not None else 0.0)
                continue
            logps.append(logp)
            entropies.append(entropy)
        logps[0] = logps[0] + unused
        logp = _in_frame(torch.cat(logps), selected)
        entropy = _in_frame(torch.cat(entropies), selected) if with_entropy else None
        return logp, entropy

    def _row_states(self, batch: MicroBatch, selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The hidden states that predict the ``selected`` response tokens, ``(N, H)``, and those tokens.

        Response token k of sample i is predicted at position ``start_i - 1 + k`` of the sample
        (position p predicts token p + 1), found in the flattened forward at the sample's offset:
        ``i x L`` in a right-padded ``(B, L)`` batch, its ``cu_seqlens`` entry in a packed row.
        """
        if batch.packed is not None:
            enable_packed_attention(self.model)  # once: unpacked calls (the hf engine's) still run SDPA
            hidden = self.model.get_decoder()(**batch.packed.model_inputs()).last_hidden_state[0]  # (T, H)
            offsets = batch.packed.starts  # (B,)
        else:
            hidden = self.model.get_decoder()(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
            ).last_hidden_state  # (B, L, H)
            offsets = torch.arange(hidden.shape[0], device=hidden.device) * hidden.shape[1]
            hidden = hidden.reshape(-1, hidden.shape[-1])  # (B L, H)
        rows, columns = selected.nonzero(as_tuple=True)  # (N,) each, row-major as selected's indexing
        positions = offsets[rows] + batch.response_start[rows] - 1 + columns  # (N,)
        return hidden.index_select(0, positions), batch.input_ids.reshape(-1)[positions + 1]

    def _shared_prompt_states(self, batch: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`_full_states`, each distinct prompt computed once.

        Response token 0 of row i is predicted by its prompt's last position, token k >= 1 by
        response position k - 1 (whose keys are the prompt's and the response's first k).
        """
        from transformers import DynamicCache

        shared = batch.shared
        cache = DynamicCache(config=self.model.config)
        prompt_hidden = self.model.get_decoder()(
            input_ids=shared.prompt_ids, attention_mask=shared.prompt_mask, past_key_values=cache, use_cache=True
        ).last_hidden_state  # (G, P, H)
        rows = shared.row_prompt
        for layer in cache.layers:  # the group's keys and values for each of its rows
            layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)
        prompt_length = shared.prompt_mask.sum(1)  # (G,)
        response_width = shared.response_ids.shape[1]
        positions = prompt_length[rows][:, None] + torch.arange(response_width, device=rows.device)[None, :]
        response_hidden = self.model.get_decoder()(
            input_ids=shared.response_ids,
            attention_mask=torch.cat([shared.prompt_mask.index_select(0, rows), shared.response_mask], dim=1),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state  # (B, R, H)
        hidden_size = prompt_hidden.shape[-1]
        last = (prompt_length - 1)[:, None, None].expand(-1, 1, hidden_size)
        prompt_last = prompt_hidden.gather(1, last).index_select(0, rows)  # (B, 1, H)
        states = torch.cat([prompt_last, response_hidden[:, :-1]], dim=1)  # (B, R, H)
        return states, shared.response_ids

    def _chunk(self, states: torch.Tensor, labels: torch.Tensor, with_entropy: bool, entropy_grad: bool):
        """Log-probs (and entropies) of one chunk of positions: the (N, V) logits in the model's
        dtype, float32 one block of rows at a time (no float32 copy of the chunk's logits)."""
        logits = self.model.get_output_embeddings()(states)  # (N, V)
        logp = sampled_token_logprobs(logits, labels, self.temperature)  # (N,) float32
        if not with_entropy:
            return logp, None
        if entropy_grad and torch.is_grad_enabled():  # an entropy term in the loss: differentiable
            tempered = logits if self.temperature == 1.0 else logits.float() / self.temperature
            return logp, entropy_from_logits(tempered[None])[0]
        return logp, blockwise_entropy(logits.detach(), self.temperature)  # (N,) a statistic only


class AdapterDisabled:
    """The reference policy of a LoRA actor (``grpo.lora`` with a KL variant): the actor's own
    forward with its adapter off (PEFT's ``disable_adapter``), which is the initial policy (the
    adapter starts at zero) - no second copy of the model. Called as the frozen reference is,
    under ``torch.no_grad`` with the actor in eval mode (:meth:`agentrl.grpo.step.GrpoStep.recompute_logprobs`)."""

    def __init__(self, actor: ResponseLogProbs) -> None:
        self.actor = actor

    def __call__(self, batch: MicroBatch, **kwargs):
        with self.actor.model.disable_adapter():
            return self.actor(batch, **kwargs)


def engine_weights(policy: nn.Module, rollout: RolloutConfig) -> Iterable[tuple[str, torch.Tensor]]:
    """What a colocated rollout engine's ``update_weights`` gets after an update.

    The ``hf`` engine shares the actor's module (the one engine that does, as
    :func:`old_logprobs_source` says): its own parameters, so nothing is copied and only its
    parked caches are dropped, a LoRA module's adapters included. vLLM loads Hugging Face-named
    weights: the parameters, or a LoRA actor's merged weights one at a time
    (:func:`agentrl.training.lora.hf_weights`; docs/design.md says why merged weights, not vLLM's
    LoRA)."""
    return policy.named_parameters() if rollout.engine == "hf" else hf_weights(policy)


def _in_frame(values: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """``(N,)`` values at the ``selected`` positions of a ``(B, R)`` frame of zeros (differentiable)."""
    frame = values.new_zeros(selected.shape)
    return frame.masked_scatter(selected, values)
