"""``rollout.engine: hf``: batched sampling with a transformers model, on CPU or GPU.

A hand-rolled decoding loop rather than ``model.generate``: it returns the exact log-probability
of each sampled token under the distribution it was drawn from (see ``engine.py``), stops each
sequence on its own stop tokens or the model's end of sequence (as vLLM), and schedules requests continuously, as vLLM does: a running
batch of at most ``rollout.batch_size`` sequences decodes one token per :meth:`HFEngine.step`;
sequences that end leave it and queued requests take their places (a prefill merged into the
batch), so no sequence waits for the slowest of its batch. ``generate`` is the same scheduler
run to the end over one call's prompts.

Keys and values live in one cache for the batch (:mod:`agentrl.rollout.hf_cache`), left-padded: a row's tokens are its
unmasked columns, and the masked ones ("holes", where rows of different lengths were merged or
a row has ended) are skipped by the attention mask, with each row's positions given explicitly.
The cache is compacted when holes make up a large share of it.

Multi-turn trajectories are continued, not re-read: a request with a ``session`` that ends on a
stop token leaves its keys and values parked under the session; the session's next request (the
trajectory's context plus the tool response) takes them back and prefills only the new tokens,
so each token of a trajectory is computed once. The ``n`` samples of a prompt share one prefill
(identical fresh prompts admitted together are computed once and their cache rows copied).
Logits then come from different matrix shapes than a full re-prefill would use: they agree to
float round-off (about 1e-6 in float32,
tests/test_rollout_scheduling.py::test_a_session_continues_from_its_parked_cache_with_the_logits_of_a_full_prefill),
so samples are the same except where a uniform draw falls within that distance of a boundary of
the token's CDF.

Sampling order (as vLLM): ``logits / temperature`` -> top-k -> top-p -> sample from the softmax.
Seeds are per request, as vLLM's: request ``i`` of a call draws its tokens from its own
``random.Random(seeds[i])`` (default ``params.seed + i``), one uniform number per token,
mapped through the row's cumulative distribution (inverse-CDF sampling, one batched
``searchsorted``). So a sequence's sample depends on its seed and its own logits only, not on
which other sequences share its batch or when it was admitted; callers that split work
differently (scoring shards, a resumed job) get the same samples as long as the logits come out
the same. A request without a seed draws from a seed of the engine's own fresh stream.

The engine may share its module with the trainer (``make_engine(..., model=policy)``): weight
updates are then already in place and :meth:`HFEngine.update_weights` only copies tensors that
are not the module's own.
"""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from agentrl.model.tokenizer import end_of_sequence_ids
from agentrl.rollout.engine import GenerationOutput, Request, SamplingParams
from agentrl.rollout.hf_cache import batch_cache, cached_layers, use_cpu_gqa_attention
from agentrl.rollout.weight_transfer import GlooWeightReceiver, load_into_module

if TYPE_CHECKING:
    from transformers.cache_utils import Cache

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


class _Running:
    """A request in the running batch: its sampler, the ids the batch cache holds for it, its output."""

    __slots__ = ("request", "rng", "fed", "stop_ids", "tokens", "logprobs", "reason")

    def __init__(self, request: Request, rng: random.Random, fed: list[int], eos_ids: frozenset[int]) -> None:
        self.request = request
        self.rng = rng
        self.fed = fed  # ids whose keys and values the cache holds for this row, in order
        self.stop_ids = frozenset(request.params.stop_token_ids) | eos_ids
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.reason: str | None = None  # 'stop' | 'length' once ended

    def context(self) -> list[int]:
        return self.request.prompt_ids + self.tokens


class _Parked:
    """A session's keys and values between two of its requests: ``ids`` and per layer (1, heads, len(ids), dim)."""

    __slots__ = ("ids", "layers")

    def __init__(self, ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.ids = ids
        self.layers = layers


@dataclass
class EngineCounters:
    """What the engine computed: prompt tokens prefilled, prompt tokens taken from a parked or shared
    cache instead, tokens decoded, forward passes, cache compactions."""

    prefilled: int = 0
    reused: int = 0
    decoded: int = 0
    forwards: int = 0
    compactions: int = 0


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class HFEngine:
    """Continuously batched generation with a ``transformers`` causal LM (implements :class:`engine.Engine`)."""

    # Rebuild the batch (drop ended rows, admit queued requests) once this share of it is free:
    # every rebuild copies the KV cache, so doing it for every single row would cost more than it saves.
    prune_share = 0.125
    # Compact the cache when its holes exceed this share of the longest row (and 32 columns).
    hole_share = 0.25

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pad_token_id: int,
        batch_size: int = 64,
        logits_processor: LogitsProcessor | None = None,
        max_parked: int | None = None,
        eos_token_ids: Iterable[int] | None = None,
    ) -> None:
        assert batch_size >= 1, f"batch_size must be >= 1, got {batch_size}"
        self.model = model
        # End of sequence stops every request besides its own stop tokens, as in vLLM (default:
        # the model's own, agentrl.model.tokenizer.end_of_sequence_ids without a tokenizer).
        self.eos_ids = frozenset(end_of_sequence_ids(model) if eos_token_ids is None else eos_token_ids)
        use_cpu_gqa_attention(model)
        self.num_layers = model.config.num_hidden_layers
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size
        self.logits_processor = logits_processor
        # Parked sessions at most (oldest dropped first; a dropped one is re-prefilled, not lost):
        # the agent loop has at most a batch of trajectories waiting on tools at any time.
        self.max_parked = max_parked if max_parked is not None else 4 * batch_size
        self.counters = EngineCounters()
        self._waiting: deque[Request] = deque()
        self._rows: list[_Running] = []
        self._cache: Cache | None = None
        self._mask = torch.zeros((0, 0), dtype=torch.long)
        self._logits: torch.Tensor | None = None
        self._parked: OrderedDict[str, _Parked] = OrderedDict()
        self._fresh = random.Random()  # requests without a seed: fresh randomness
        self._ids = itertools.count()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ request-level API
    def add_request(self, request: Request) -> None:
        self._waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self._waiting) or any(row.reason is None for row in self._rows)

    def end_session(self, session: str) -> None:
        self._parked.pop(session, None)

    def step(self) -> list[tuple[str, GenerationOutput]]:
        """Admit queued requests where there is room, then sample one token for every running row."""
        if not self.model.training:
            return self._step()
        self.model.eval()  # a module shared with the trainer (GRPO)
        try:
            return self._step()
        finally:
            self.model.train()

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_tokens: Sequence[int] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[GenerationOutput]:
        assert not self.has_unfinished_requests(), "generate() while requests of the request-level API are running"
        caps = [params.max_tokens] * len(prompt_ids)
        if max_tokens is not None:
            caps = [min(cap, params.max_tokens) for cap in max_tokens]
        assert len(caps) == len(prompt_ids), f"{len(caps)} max_tokens for {len(prompt_ids)} prompts"
        if seeds is None and params.seed is not None:
            seeds = [params.seed + i for i in range(len(prompt_ids))]
        assert seeds is None or len(seeds) == len(prompt_ids), f"{len(seeds)} seeds for {len(prompt_ids)} prompts"
        call = next(self._ids)
        ids = [f"generate-{call}-{i}" for i in range(len(prompt_ids))]
        # Longest first: similar lengths share the batch (fewer holes), and the batch that needs
        # the most memory runs first, so an out-of-memory error shows up at once.
        for i in sorted(range(len(prompt_ids)), key=lambda i: -len(prompt_ids[i])):
            seed = None if seeds is None else seeds[i]
            self.add_request(Request(ids[i], list(prompt_ids[i]), params.replace(max_tokens=caps[i], seed=seed)))
        done: dict[str, GenerationOutput] = {}
        while self.has_unfinished_requests():
            done.update(self.step())
        return [done[i] for i in ids]

    # ------------------------------------------------------------------ scheduling
    @torch.inference_mode()
    def _step(self) -> list[tuple[str, GenerationOutput]]:
        self._schedule()
        live = [i for i, row in enumerate(self._rows) if row.reason is None]
        if not live:
            return []
        rows = [self._rows[i] for i in live]
        logits = self._logits[live].float()
        if self.logits_processor is not None:
            logits = self.logits_processor(self._left_padded([row.context() for row in rows]), logits)
        uniforms = torch.tensor([row.rng.random() for row in rows], dtype=torch.float64, device=logits.device)
        tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        logprobs = torch.empty(len(rows), dtype=logits.dtype, device=logits.device)
        for params, members in _by_sampling(rows):  # one group unless callers mix sampling settings
            index = torch.tensor(members, device=logits.device)
            tokens[index], logprobs[index] = sample_tokens(logits[index], params, uniforms[index])
        feed = torch.full((len(self._rows),), self.pad_token_id, dtype=torch.long)
        fed = torch.zeros(len(self._rows), dtype=torch.long)
        ended = []
        for i, row, token, logprob in zip(live, rows, tokens.tolist(), logprobs.tolist()):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            if token in row.stop_ids:
                row.reason = "stop"
            elif len(row.tokens) >= row.request.params.max_tokens:
                row.reason = "length"
            if row.reason is not None:
                ended.append((row.request.request_id, GenerationOutput(row.tokens, row.logprobs, row.reason)))
                continue
            feed[i], fed[i] = token, 1
            row.fed.append(token)
        self.counters.decoded += len(rows)
        if len(ended) < len(rows):
            device = self.device
            self._mask = torch.cat([self._mask, fed.to(device)[:, None]], dim=1)
            positions = torch.tensor([[len(row.fed) - 1] for row in self._rows], dtype=torch.long, device=device)
            self._logits = self._forward(feed.to(device)[:, None], self._mask, positions, self._cache)
        return ended

    def _schedule(self) -> None:
        """Drop ended rows (parking their sessions) and admit queued requests, when it is worth a rebuild."""
        ended = [i for i, row in enumerate(self._rows) if row.reason is not None]
        live = [i for i, row in enumerate(self._rows) if row.reason is None]
        admissible = min(self.batch_size - len(live), len(self._waiting))
        threshold = max(1, int(self.prune_share * self.batch_size))
        if not (
            len(ended) >= threshold
            or admissible >= threshold
            or (admissible and len(live) < threshold)
            or (ended and not live)
        ):
            return
        for i in ended:
            self._park(i)
        if live:
            if ended:
                keep = torch.tensor(live, device=self.device)
                self._cache.batch_select_indices(keep)
                self._mask, self._logits = self._mask[keep], self._logits[keep]
                self._rows = [self._rows[i] for i in live]
        else:
            self._rows, self._cache, self._logits = [], None, None
            self._mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        if admissible:
            self._admit([self._waiting.popleft() for _ in range(admissible)])
        self._compact_if_sparse()

    def _park(self, i: int) -> None:
        """Keep row ``i``'s keys and values under its session (only a turn that stopped can continue)."""
        row = self._rows[i]
        session = row.request.session
        if session is None or row.reason != "stop":
            return
        valid = self._mask[i].nonzero()[:, 0]
        assert len(valid) == len(row.fed), f"row of {row.request.request_id}: {len(valid)} cached, {len(row.fed)} fed"
        layers = [
            (keys[i : i + 1, :, valid], values[i : i + 1, :, valid]) for keys, values in cached_layers(self._cache)
        ]
        self._parked[session] = _Parked(row.fed, layers)
        self._parked.move_to_end(session)
        while len(self._parked) > self.max_parked:
            self._parked.popitem(last=False)

    def _admit(self, requests: list[Request]) -> None:
        """Prefill ``requests`` (continuing parked sessions, sharing identical fresh prompts) into the batch."""
        device = self.device
        starts = []  # per request: (parked cache or None, the ids still to prefill)
        for request in requests:
            parked = self._parked.pop(request.session, None) if request.session is not None else None
            prompt = request.prompt_ids
            if parked is not None and not (len(prompt) > len(parked.ids) and prompt[: len(parked.ids)] == parked.ids):
                parked = None  # not a continuation of what was parked: prefill it whole
            starts.append((parked, prompt[len(parked.ids) :] if parked is not None else prompt))
        unique: dict[tuple[int, ...], int] = {}
        computed: list[tuple[_Parked | None, list[int]]] = []
        row_of = []
        for parked, new in starts:
            if parked is None:
                key = tuple(new)
                if key not in unique:
                    unique[key] = len(computed)
                    computed.append((None, new))
                else:
                    self.counters.reused += len(new)
                row_of.append(unique[key])
            else:
                self.counters.reused += len(parked.ids)
                row_of.append(len(computed))
                computed.append((parked, new))
        cached = max((len(p.ids) for p, _ in computed if p is not None), default=0)
        width = max(len(new) for _, new in computed)
        batch = len(computed)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, cached + width), dtype=torch.long)
        positions = torch.zeros((batch, width), dtype=torch.long)
        for b, (parked, new) in enumerate(computed):
            before = len(parked.ids) if parked is not None else 0
            mask[b, cached - before : cached] = 1
            input_ids[b, width - len(new) :] = torch.tensor(new, dtype=torch.long)
            mask[b, cached + width - len(new) :] = 1
            positions[b, width - len(new) :] = torch.arange(before, before + len(new))
            self.counters.prefilled += len(new)
        layers = []
        if cached:
            template = next(p for p, _ in computed if p is not None).layers
            for layer, (keys, values) in enumerate(template):
                shape = (batch, keys.shape[1], cached, keys.shape[3])
                k, v = keys.new_zeros(shape), values.new_zeros(shape)
                for b, (parked, _) in enumerate(computed):
                    if parked is not None:
                        k[b, :, cached - len(parked.ids) :] = parked.layers[layer][0][0]
                        v[b, :, cached - len(parked.ids) :] = parked.layers[layer][1][0]
                layers.append((k, v))
        cache = batch_cache(layers, num_layers=self.num_layers)
        mask = mask.to(device)
        logits = self._forward(input_ids.to(device), mask, positions.to(device), cache)
        if row_of != list(range(batch)):
            index = torch.tensor(row_of, device=device)
            cache.batch_select_indices(index)
            mask, logits = mask[index], logits[index]
        rows = []
        for request, (parked, new) in zip(requests, starts):
            seed = request.params.seed
            rng = random.Random(seed) if seed is not None else random.Random(self._fresh.getrandbits(64))
            rows.append(_Running(request, rng, (parked.ids if parked is not None else []) + list(new), self.eos_ids))
        self._merge(cache, mask, logits, rows)

    def _merge(self, cache: Cache, mask: torch.Tensor, logits: torch.Tensor, rows: list[_Running]) -> None:
        """Append admitted rows to the running batch, left-padding the narrower cache with holes."""
        if not self._rows:
            self._cache, self._mask, self._logits, self._rows = cache, mask, logits, rows
            return
        width = max(self._mask.shape[1], mask.shape[1])
        self._cache = batch_cache(
            [
                (
                    torch.cat([_pad_left(k1, width, 2), _pad_left(k2, width, 2)]),
                    torch.cat([_pad_left(v1, width, 2), _pad_left(v2, width, 2)]),
                )
                for (k1, v1), (k2, v2) in zip(cached_layers(self._cache), cached_layers(cache))
            ],
            num_layers=self.num_layers,
        )
        self._mask = torch.cat([_pad_left(self._mask, width, 1), _pad_left(mask, width, 1)])
        self._logits = torch.cat([self._logits, logits])
        self._rows = self._rows + rows

    def _compact_if_sparse(self) -> None:
        """Move every row's cached columns to the right end of a cache as wide as the longest row."""
        if not self._rows:
            return
        counts = self._mask.sum(dim=1)
        longest, width = int(counts.max()), self._mask.shape[1]
        if width - longest <= max(32, int(self.hole_share * longest)):
            return
        rows, columns = self._mask.nonzero(as_tuple=True)
        target = (longest - counts)[rows] + self._mask.cumsum(dim=1)[rows, columns] - 1
        index = torch.zeros((len(self._rows), longest), dtype=torch.long, device=self._mask.device)
        index[rows, target] = columns
        mask = torch.zeros_like(index)
        mask[rows, target] = 1
        compacted = []
        for keys, values in cached_layers(self._cache):
            gather = index[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
            compacted.append((keys.gather(2, gather), values.gather(2, gather)))
        self._cache, self._mask = batch_cache(compacted, num_layers=self.num_layers), mask
        self.counters.compactions += 1

    def _left_padded(self, contexts: list[list[int]]) -> torch.Tensor:
        width = max(len(c) for c in contexts)
        out = torch.full((len(contexts), width), self.pad_token_id, dtype=torch.long, device=self.device)
        for b, context in enumerate(contexts):
            out[b, width - len(context) :] = torch.tensor(context, dtype=torch.long)
        return out

    def _forward(self, input_ids, attention, positions, cache) -> torch.Tensor:
        self.counters.forwards += 1
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
        """Nothing on the accelerator to free but the parked sessions (the module is the trainer's own)."""
        self._parked.clear()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the given tensors into the module; tensors that already are its parameters are skipped
        (:func:`~agentrl.rollout.weight_transfer.load_into_module`).

        Parked keys and values were computed with the old weights: they are dropped.
        """
        assert not self.has_unfinished_requests(), "update_weights while requests are running"
        self._parked.clear()
        load_into_module(self.model, named_tensors)

    def weight_sync(self) -> GlooWeightReceiver:
        """The ``agentrl_gloo`` backend's inference side: each tensor copied into the module as it
        arrives (:meth:`update_weights`, which casts to the module's dtype)."""
        return GlooWeightReceiver(self.update_weights)


def _by_sampling(rows: list[_Running]) -> list[tuple[SamplingParams, list[int]]]:
    """Row positions grouped by their sampling settings (temperature, top-p, top-k)."""
    groups: dict[tuple[float, float, int], tuple[SamplingParams, list[int]]] = {}
    for position, row in enumerate(rows):
        p = row.request.params
        groups.setdefault((p.temperature, p.top_p, p.top_k), (p, []))[1].append(position)
    return list(groups.values())
