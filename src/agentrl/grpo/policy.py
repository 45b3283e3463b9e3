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
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from agentrl.grpo.algorithm import entropy_from_logits, token_logprobs
from agentrl.grpo.batching import MicroBatch


class ResponseLogProbs(nn.Module):
    """``forward(batch) -> (logp (B, R), entropy (B, R) or None)`` for a :class:`MicroBatch`."""

    def __init__(self, model: nn.Module, *, logit_chunk_tokens: int, temperature: float) -> None:
        super().__init__()
        assert logit_chunk_tokens >= 1, f"logit_chunk_tokens must be >= 1, got {logit_chunk_tokens}"
        assert temperature > 0, f"the log-prob temperature must be positive, got {temperature}"
        self.model = model
        self.logit_chunk_tokens = logit_chunk_tokens
        self.temperature = temperature

    def forward(self, batch: MicroBatch, with_entropy: bool = False, entropy_grad: bool = False):
        hidden = self.model.base_model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
        ).last_hidden_state  # (B, L, H)
        batch_size, width, hidden_size = hidden.shape
        response_width = batch.loss_mask.shape[1]
        offsets = torch.arange(response_width, device=hidden.device)
        # Position p predicts token p + 1: response token k of row i is predicted at start_i - 1 + k.
        positions = (batch.response_start[:, None] - 1 + offsets[None, :]).clamp(0, width - 2)  # (B, R)
        labels = batch.input_ids.gather(1, positions + 1)  # (B, R)
        states = hidden.gather(1, positions[:, :, None].expand(-1, -1, hidden_size))  # (B, R, H)

        flat_states = states.reshape(-1, hidden_size)
        flat_labels = labels.reshape(-1)
        logps, entropies = [], []
        for start in range(0, flat_states.shape[0], self.logit_chunk_tokens):
            chunk = slice(start, start + self.logit_chunk_tokens)
            if torch.is_grad_enabled():
                logp, entropy = checkpoint(
                    self._chunk, flat_states[chunk], flat_labels[chunk], with_entropy, entropy_grad, use_reentrant=False
                )
            else:
                logp, entropy = self._chunk(flat_states[chunk], flat_labels[chunk], with_entropy, entropy_grad)
            logps.append(logp)
            entropies.append(entropy)
        logp = torch.cat(logps).view(batch_size, response_width)
        entropy = torch.cat(entropies).view(batch_size, response_width) if with_entropy else None
        return logp, entropy

    def _chunk(self, states: torch.Tensor, labels: torch.Tensor, with_entropy: bool, entropy_grad: bool):
        logits = self.model.get_output_embeddings()(states)  # (N, V)
        logp = token_logprobs(logits[None], labels[None], self.temperature)[0]  # (N,)
        if not with_entropy:
            return logp, None
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            tempered = logits if self.temperature == 1.0 else logits.float() / self.temperature
            entropy = entropy_from_logits(tempered[None])[0]  # (N,)
        return logp, entropy
