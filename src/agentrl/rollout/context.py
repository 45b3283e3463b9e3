"""How many tokens one request of the agent loop can hold: the engine's context (``max_model_len``).

A request is the prompt as the loop renders it (the chat template with the ``code_interpreter``
tool schema) plus the response so far plus the tokens it may still generate. The response is
bounded by ``rollout.max_response_tokens`` (tool tokens included), the prompt by
``rollout.max_prompt_tokens`` as ``rollout.prompt_length_with_tools`` measures it: with the tool
schema (the embedded default), or without it (upstream's filter, the paper presets), in which case
a kept prompt is the schema block (about 150 tokens for Qwen3) longer in the loop. The context
must cover that block too: vLLM's input processor refuses a prompt of ``max_model_len`` tokens or
more (``VLLMValidationError``, which ends a GRPO rank) and caps generation silently at
``max_model_len`` (``FINISHED_LENGTH_CAPPED``), before the response budget.

:func:`context_tokens` is that bound, measured with the tokenizer's real rendering. The agent loop
also checks every request against it and ends a trajectory whose next turn would not fit with
``length`` (as the budget does), so a prompt that renders longer than the probes here say (a
template whose tool block depends on the messages) shortens one trajectory instead of failing
the job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentrl.data.prompt_fit import prompt_length

if TYPE_CHECKING:
    from agentrl.config import RolloutConfig

# Conversations whose rendering with and without the tool schema measures the schema block: the
# chat template puts the block in a system turn of its own, or appends it to the caller's system
# message (Qwen3's template does both), so both shapes are measured.
SCHEMA_PROBES = (
    [{"role": "user", "content": "Solve it."}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Solve it."}],
)


def tool_schema_tokens(tokenizer) -> int:
    """Tokens the tool schema adds to a rendered prompt: the largest difference, over
    :data:`SCHEMA_PROBES`, between the prompt rendered with the schema and without it."""
    return max(
        prompt_length(tokenizer, messages, with_tools=True) - prompt_length(tokenizer, messages, with_tools=False)
        for messages in SCHEMA_PROBES
    )


def context_tokens(tokenizer, cfg: RolloutConfig) -> int:
    """The longest request the agent loop can send, and so the engine's ``max_model_len``::

        context = max_prompt_tokens + [not prompt_length_with_tools] * tool_schema_tokens + max_response_tokens

    A prompt kept by ``fit-prompts`` renders, as the loop sends it, in at most
    ``max_prompt_tokens + tool_schema_tokens`` tokens when its length was measured without the
    schema, and in at most ``max_prompt_tokens`` when with it.

    ``rollout.max_model_len: upstream`` leaves the schema out (verl's ``max_model_len`` is
    ``max_prompt_length + max_response_length``, 23040 in the paper's script): a prompt longer
    than ``max_prompt_tokens`` as the loop renders it then has that many tokens less to respond in.
    """
    schema = 0 if cfg.prompt_length_with_tools or cfg.max_model_len == "upstream" else tool_schema_tokens(tokenizer)
    return cfg.max_prompt_tokens + schema + cfg.max_response_tokens


def request_room(context: int, prompt_tokens: int, response_tokens: int, budget: int) -> int:
    """Tokens the next turn may generate: what the response budget has left, and no more than
    fits the context (``prompt + response so far + new <= context``); 0 or less: no request fits."""
    return min(budget - response_tokens, context - prompt_tokens - response_tokens)
