"""``rollout.engine: hf``: batched sampling with a transformers model, on CPU or GPU.

A hand-rolled decoding loop rather than ``model.generate``: it returns the exact log-probability
of each sampled token under the distribution it was drawn from (see ``engine.py``), stops each
sequence on its own stop token, and drops finished sequences from the batch and the KV cache so
they stop costing compute. Prompts are sorted by length and cut into batches of
``rollout.batch_size`` (less padding), left-padded, prefilled once, then decoded one token per
step with a ``DynamicCache``.

Sampling order (as vLLM): ``logits / temperature`` -> top-k -> top-p -> sample from the softmax.
Seeds are per sequence, as vLLM's per-request seeds: row ``i`` of a call draws its tokens from
its own ``random.Random(seeds[i])`` (default ``params.seed + i``), one uniform number per token,
mapped through the row's cumulative distribution (inverse-CDF sampling, one batched
``searchsorted``). So a sequence's sample depends on its seed and its own logits only, not on
which other sequences share its batch; callers that split work differently (scoring shards, a
resumed job) get the same samples as long as the logits come out the same.

The engine may share its module with the trainer (``make_engine(..., model=policy)``): weight
updates are then already in place and :meth:`HFEngine.update_weights` only copies tensors that
are not the module's own.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence

import torch
from transformers import DynamicCache

from agentrl.rollout.engine import GenerationOutput, SamplingParams

# (sequences (B, T): left-padded prompts + ids generated so far, next-token logits (B, V)) -> logits,
# as transformers' LogitsProcessor: a hook for constrained decoding (and for tests that force tokens).
LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the smallest nucleus of mass >= top_p.

    logits: (B, V) float32, already divided by the temperature. The most likely token always stays.
    """
    if top_k != -1 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # (B, V) probability mass ranked above each token
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return ``(tokens (B,), logprobs (B,))``.

    ``uniforms`` (B,) in [0, 1), one per row, pick the tokens by inverse CDF: row ``b`` takes the
    first token whose cumulative probability exceeds ``uniforms[b]`` (float64 sums, so the choice
    depends on the row's own distribution only); ``None`` samples with fresh randomness.
    ``logprobs`` are under the distribution sampled from (tempered and filtered); for greedy
    decoding, under the untempered model distribution (a point mass carries no information).
    """
    logits = logits.float()
    if params.greedy:
        tokens = logits.argmax(dim=-1)
        logprobs = logits.log_softmax(dim=-1).gather(-1, tokens[:, None])[:, 0]
        return tokens, logprobs
    processed = filter_logits(logits / params.temperature, params.top_k, params.top_p).log_softmax(dim=-1)
    if uniforms is None:
        tokens = torch.multinomial(processed.exp(), 1)[:, 0]
    else:
        cdf = processed.exp().double().cumsum(dim=-1)  # (B, V)
        total = cdf[:, -1]
        # Below the total: the first entry above it then has non-zero probability.
        target = torch.minimum(uniforms.to(cdf) * total, torch.nextafter(total, torch.zeros_like(total)))
        tokens = torch.searchsorted(cdf, target[:, None], right=True)[:, 0]
    return tokens, processed.gather(-1, tokens[:, None])[:, 0]


class HFEngine:
    """Batched generation with a ``transformers`` causal LM (implements :class:`engine.Engine`)."""

    # Rebuild the batch without finished rows once this share of it has finished: pruning copies
    # the KV cache, so doing it for every single finished row would cost more than it saves.
    prune_share = 0.125

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pad_token_id: int,
        batch_size: int = 64,
        logits_processor: LogitsProcessor | None = None,
    ) -> None:
        assert batch_size >= 1, f"batch_size must be >= 1, got {batch_size}"
        self.model = model
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size
        self.logits_processor = logits_processor

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_tokens: Sequence[int] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[GenerationOutput]:
        assert all(len(p) > 0 for p in prompt_ids), "every prompt needs at least one token"
        caps = [params.max_tokens] * len(prompt_ids)
        if max_tokens is not None:
            caps = [min(cap, params.max_tokens) for cap in max_tokens]
        assert len(caps) == len(prompt_ids), f"{len(caps)} max_tokens for {len(prompt_ids)} prompts"
        assert all(c >= 1 for c in caps), "every max_tokens must be >= 1"
        if seeds is None and params.seed is not None:
            seeds = [params.seed + i for i in range(len(prompt_ids))]
        assert seeds is None or len(seeds) == len(prompt_ids), f"{len(seeds)} seeds for {len(prompt_ids)} prompts"
        rngs = None if seeds is None else [random.Random(seed) for seed in seeds]
        # Longest first: similar lengths share a batch (less padding), and the batch that needs
        # the most memory runs first, so an out-of-memory error shows up at once.
        order = sorted(range(len(prompt_ids)), key=lambda i: -len(prompt_ids[i]))
        outputs: list[GenerationOutput | None] = [None] * len(prompt_ids)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                batch = self._generate_batch(
                    [prompt_ids[i] for i in chunk],
                    [caps[i] for i in chunk],
                    params,
                    None if rngs is None else [rngs[i] for i in chunk],
                )
                for index, output in zip(chunk, batch):
                    outputs[index] = output
        finally:
            self.model.train(was_training)
        return outputs  # type: ignore[return-value]

    @torch.inference_mode()
    def _generate_batch(
        self,
        prompts: list[Sequence[int]],
        caps: list[int],
        params: SamplingParams,
        rngs: list[random.Random] | None,
    ) -> list[GenerationOutput]:
        device = self.device
        batch, width = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long, device=device)
        attention = torch.zeros((batch, width), dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            attention[row, width - len(prompt) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(input_ids, attention, positions, cache)

        stop_ids = torch.tensor(sorted(set(params.stop_token_ids)), dtype=torch.long, device=device)
        rows = list(range(batch))  # original row of each batch row
        finished = torch.zeros(batch, dtype=torch.bool, device=device)  # finished but not yet pruned
        tokens_out: list[list[int]] = [[] for _ in range(batch)]
        logprobs_out: list[list[float]] = [[] for _ in range(batch)]
        reasons: list[str] = ["length"] * batch
        sequences = input_ids  # only kept up to date for the logits processor
        for step in range(max(caps)):
            if self.logits_processor is not None:
                logits = self.logits_processor(sequences, logits.float())
            uniforms = None
            if rngs is not None:  # one draw per row and step: a row's stream does not see the others
                uniforms = torch.tensor([rngs[row].random() for row in rows], dtype=torch.float64, device=device)
            tokens, logprobs = sample_tokens(logits, params, uniforms)
            if self.logits_processor is not None:
                sequences = torch.cat([sequences, tokens[:, None]], dim=1)
            hit_stop = torch.isin(tokens, stop_ids) & ~finished
            live = (~finished).nonzero()[:, 0].tolist()
            for r, token, logprob in zip(live, tokens[live].tolist(), logprobs[live].tolist()):
                tokens_out[rows[r]].append(token)
                logprobs_out[rows[r]].append(logprob)
            for r in hit_stop.nonzero()[:, 0].tolist():
                reasons[rows[r]] = "stop"
            at_cap = torch.tensor([caps[row] == step + 1 for row in rows], device=device)
            finished |= hit_stop | at_cap  # 'length' is the default reason
            if bool(finished.all()):
                break
            if int(finished.sum()) >= max(1, int(self.prune_share * len(rows))):
                keep = (~finished).nonzero()[:, 0]
                cache.batch_select_indices(keep)
                rows = [rows[r] for r in keep.tolist()]
                attention, positions = attention[keep], positions[keep]
                tokens, sequences, finished = tokens[keep], sequences[keep], finished[keep]
            attention = torch.cat([attention, attention.new_ones((len(rows), 1))], dim=1)
            positions = positions[:, -1:] + 1
            logits = self._forward(tokens[:, None], attention, positions, cache)
        return [GenerationOutput(t, lp, r) for t, lp, r in zip(tokens_out, logprobs_out, reasons)]

    def _forward(self, input_ids, attention, positions, cache) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :]

    def sleep(self) -> None:
        """Nothing to free: the module is the trainer's own (or holds no cache between calls)."""

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the given tensors into the module; tensors that already are its parameters are skipped."""
        own = dict(self.model.named_parameters(remove_duplicate=False))
        own.update(dict(self.model.named_buffers()))
        for name, tensor in named_tensors:
            if name not in own:
                raise KeyError(f"update_weights: {name!r} is not a parameter of the rollout model")
            target = own[name]
            assert target.shape == tensor.shape, (
                f"update_weights: {name} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
            )
            if target.data_ptr() != tensor.data_ptr():
                target.copy_(tensor)
