"""Render a multi-turn tool-use conversation with the chat template and mark the tokens SFT trains on.

Recipe (docs/recipe.md section 5, upstream's multi-turn SFT dataset): the loss covers the assistant
turns only - their content, the rendered tool-call text and the closing ``<|im_end|>`` - and not
the ``<|im_start|>assistant\\n`` header, the system block (with the tool list), user turns or tool
responses.

How the spans are found: the conversation is rendered once with ``apply_chat_template(messages,
tools=tools)``; for every assistant message the prefix up to it is rendered again with
``add_generation_prompt=True`` (text ending in ``<|im_start|>assistant\\n``) and the prefix
through it without. Both must be prefixes of the full text (checked: a template that rewrites
earlier turns, e.g. one that drops past reasoning, is refused with the example named), so the
assistant span is exactly the characters in between, up to and including its last
``<|im_end|>``; the newline the template writes after ``<|im_end|>`` is not trained (the model
stops at ``<|im_end|>`` and never generates it).

Tokenization: the text is cut at the span boundaries and each piece is tokenized on its own, then
concatenated. This is how the agent loop sees a conversation (the prompt ending in
``<|im_start|>assistant\\n`` is tokenized, generated ids are appended, tool responses are
tokenized and appended), so a BPE merge across a turn boundary - possible when the content
starts with whitespace - can never make SFT train on token ids the rollout would not produce.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

END_OF_TURN = "<|im_end|>"
ROLES = ("system", "user", "assistant", "tool")


def _render(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> str:
    return tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )


def _check_messages(messages: Sequence[dict[str, Any]]) -> None:
    if not messages:
        raise ValueError("the conversation has no messages")
    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"message {index}: role {role!r} is not one of {ROLES}")
        if role == "assistant" and index == 0:
            raise ValueError("message 0 is an assistant turn; a conversation opens with system or user")
        if role == "assistant" and not (message.get("content") or message.get("tool_calls")):
            raise ValueError(f"message {index}: an assistant turn with neither content nor tool_calls")


def assistant_char_spans(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the ``[start, end)`` character span of every trained assistant turn."""
    _check_messages(messages)
    full = _render(tokenizer, messages, tools, add_generation_prompt=False)
    spans: list[tuple[int, int]] = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        header = _render(tokenizer, messages[:index], tools, add_generation_prompt=True)
        through = _render(tokenizer, messages[: index + 1], tools, add_generation_prompt=False)
        if not (full.startswith(header) and full.startswith(through) and len(through) > len(header)):
            raise ValueError(
                f"message {index}: the chat template does not render this conversation incrementally "
                "(an earlier prefix is not a prefix of the full text), so assistant turns cannot be located"
            )
        end = through.rfind(END_OF_TURN, len(header))
        if end < 0:
            raise ValueError(f"message {index}: the rendered assistant turn has no {END_OF_TURN}")
        spans.append((len(header), end + len(END_OF_TURN)))
    return full, spans


def render_with_assistant_mask(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and a 0/1 mask (1 = trained assistant token)."""
    text, spans = assistant_char_spans(tokenizer, messages, tools)
    input_ids: list[int] = []
    loss_mask: list[int] = []
    cursor = 0
    pieces: list[tuple[int, int, int]] = []
    for start, end in spans:
        pieces += [(cursor, start, 0), (start, end, 1)]
        cursor = end
    pieces.append((cursor, len(text), 0))
    for start, end, trained in pieces:
        if start == end:
            continue
        ids = tokenizer(text[start:end], add_special_tokens=False)["input_ids"]
        input_ids += ids
        loss_mask += [trained] * len(ids)
    return input_ids, loss_mask
