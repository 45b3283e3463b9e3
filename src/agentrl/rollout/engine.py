"""The generation engine interface shared by the ``hf`` and ``vllm`` backends.

An engine turns token-id prompts into sampled continuations and takes new weights from the
trainer; nothing else. The agent loop, the trainer and the evaluation stage only see
:class:`Engine`, so they never branch on the backend's name (docs/design.md, Style). The backend is
chosen by ``rollout.engine`` through :func:`agentrl.rollout.factory.make_engine`, which imports only
the selected one (vLLM is an optional dependency).

Log-probabilities: every engine returns, per generated token, its log-probability under the
distribution it was actually sampled from: ``log_softmax(logits / temperature)`` after top-k and
top-p filtering (vLLM's ``processed_logprobs``). With ``temperature == 0`` (greedy) that
distribution is a point mass, so the engines report the untempered model log-probability
``log_softmax(logits)`` instead, which is what vLLM does for greedy requests too. GRPO recomputes
the old log-probs with the trainer's forward pass anyway (docs/recipe.md section 5); these are for
diagnostics (train/rollout mismatch) and for evaluation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import torch

    from agentrl.config import RolloutConfig
    from agentrl.rollout.weight_transfer import WeightSyncClient


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one call of :meth:`Engine.generate`.

    ``temperature == 0`` is greedy; ``top_k == -1`` and ``top_p == 1`` disable the filters.
    ``seed`` makes sampling reproducible (``None``: fresh randomness). ``stop_token_ids`` end a
    sequence when sampled (the stop token is kept in the output, as vLLM does for special stop
    tokens); the agent loop sets them to the end-of-turn and end-of-tool-call tokens.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 1024
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        assert self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"
        assert 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"
        assert self.top_k == -1 or self.top_k >= 1, f"top_k must be -1 (off) or >= 1, got {self.top_k}"
        assert self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}"

    @classmethod
    def from_config(
        cls,
        cfg: RolloutConfig,
        seed: int | None = None,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> SamplingParams:
        """The sampling settings of the ``rollout:`` config section; ``max_tokens`` is the response budget.

        ``temperature`` and ``top_p`` replace the section's values where a stage samples its own
        way (evaluation, filter scoring, GRPO validation); top-k and the budget always come from
        the section. Every caller goes through here, so the config's ``top_k: 0`` means "off"
        everywhere.
        """
        return cls(
            temperature=cfg.temperature if temperature is None else temperature,
            top_p=cfg.top_p if top_p is None else top_p,
            top_k=cfg.top_k if cfg.top_k > 0 else -1,  # the config also accepts vLLM's 0 for "off"
            max_tokens=cfg.max_response_tokens,
            seed=seed,
        )

    def replace(self, **changes) -> SamplingParams:
        return dataclasses.replace(self, **changes)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class GenerationOutput:
    """One continuation: the sampled ids (stop token included), their sampling log-probs, why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        assert len(self.token_ids) == len(self.logprobs), (
            f"{len(self.token_ids)} tokens but {len(self.logprobs)} log-probs"
        )


@dataclass(frozen=True)
class Request:
    """One continuation asked of an engine's request-level API (:meth:`Engine.add_request`).

    ``params.max_tokens`` is this request's cap and ``params.seed`` its own sampling seed (``None``:
    fresh randomness). ``session`` names the trajectory the request continues: the requests of one
    trajectory share it, and each one's prompt extends the previous one's prompt and output, so an
    engine may keep the trajectory's keys and values between them (the ``hf`` engine does; vLLM's
    prefix cache does the same by content) until :meth:`Engine.end_session`.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    session: str | None = None

    def __post_init__(self) -> None:
        assert len(self.prompt_ids) > 0, f"request {self.request_id!r}: the prompt needs at least one token"


class Engine(Protocol):
    """What the agent loop and the trainer need from a generation backend.

    Two ways to generate: :meth:`generate` takes a batch and returns when all of it is done;
    the request-level API (:meth:`add_request`, :meth:`step`, :meth:`has_unfinished_requests`,
    :meth:`end_session`, as vLLM's ``LLMEngine``) lets each request end on its own, so that the
    agent loop can run one trajectory's tool while the others keep decoding and submit its next
    turn as soon as the tool returns. Both sample the same tokens for the same seeds.
    """

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_tokens: Sequence[int] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[GenerationOutput]:
        """One continuation per prompt, in prompt order.

        ``max_tokens`` optionally caps each prompt's continuation below ``params.max_tokens`` (the
        agent loop's trajectories have different budgets left); a capped continuation ends 'length'.
        ``seeds`` gives each prompt its own sampling seed (default: ``params.seed + i``, or fresh
        randomness without ``params.seed``): a prompt's sample then does not depend on the others.
        """
        ...

    def add_request(self, request: Request) -> None:
        """Queue one request; it starts decoding at a later :meth:`step`."""
        ...

    def step(self) -> list[tuple[str, GenerationOutput]]:
        """Advance the running requests by one scheduler step (about one token each); returns
        ``(request_id, output)`` of those that ended in it."""
        ...

    def has_unfinished_requests(self) -> bool:
        """Whether a request is queued or running."""
        ...

    def end_session(self, session: str) -> None:
        """The trajectory ``session`` will send no more requests: what the engine keeps for it can go."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the trainer's current parameters (Hugging Face names) into the engine, in memory,
        for a trainer in this process (the colocated route of :mod:`agentrl.rollout.weight_transfer`);
        a sleeping engine wakes up."""
        ...

    def weight_sync(self) -> WeightSyncClient:
        """The engine's end of vLLM's weight-transfer protocol, for a trainer in another process
        (:mod:`agentrl.rollout.weight_transfer`): its four calls, made in the engine's process.
        The engine must have been built for it (``make_engine(..., weight_transfer=...)``)."""
        ...

    def sleep(self) -> None:
        """Free the accelerator memory the engine holds, for the trainer's update, until the next
        ``update_weights``, which brings the weights back (a no-op where nothing can be freed). An
        engine may discard its weights here (vLLM does: the push overwrites them), so a generate
        before that push may be refused."""
        ...


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
