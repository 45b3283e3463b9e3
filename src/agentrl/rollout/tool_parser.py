"""Hermes tool calls: parse the model's call, and the template tokens around a tool response.

Recipe (docs/recipe.md section 3): the model calls ``<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>``; only the first call of a turn is run. ``rollout.tool_call_parsing``:

- ``lenient`` (the project's): an unparsable call (bad JSON, no ``name``, an unknown tool, a
  missing ``code`` argument) is answered with ``"Error when executing tool: ..."`` as the tool
  response and the trajectory goes on. ``arguments`` may be an object or a JSON string (both
  occur in the released SFT data) and a non-string ``code`` runs as ``str(code)``. This is not
  upstream's behaviour.
- ``upstream``: verl's hermes parser drops a call that is not a JSON object with a string
  ``name`` and an ``arguments`` key (and any turn without both tags); the tool agent loop then
  sees no call and ends the trajectory. A call it keeps but the demystify tool cannot run - an
  unknown tool, ``arguments`` that are not an object (a JSON string too), no ``code``, a
  non-string ``code`` - is answered with ``"Error when executing tool: "`` and the text of the
  exception upstream's code raises there (``'code'``, ``string indices must be integers...``).

The text the loop inserts after a call (end of the assistant turn, the user turn holding
``<tool_response>``, the next ``<|im_start|>assistant\\n``) is not hard-coded: :class:`ToolTurnFormat`
renders a small conversation with the tokenizer's own chat template and cuts it around a
sentinel, so a model with another template (another system block, a thinking prefix in the
generation prompt) gets its own framing.

The tool turn's tokens are the chat template's one-pass tokenization of the rendered turn (as
upstream's loop tokenizes it, and as SFT's :func:`agentrl.sft.masking.render_with_assistant_mask`
tokenizes the same turn): the framing is cut at the template's special tokens nearest the
output, and the text between them (``user\\n<tool_response>\\n`` + output +
``\\n</tool_response>``) is one BPE pass, so a merge across the output's edge (Qwen's ``\\n\\n``
after a ``print``) is the merge the template's rendering gets. That one pass splits special
tokens (a deliberate departure: upstream parses them in the output too), so a program that
prints ``<|im_end|>`` cannot forge a turn boundary.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agentrl.data.prompts import CODE_INTERPRETER_TOOL

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
ERROR_PREFIX = "Error when executing tool: "
KNOWN_TOOLS = (CODE_INTERPRETER_TOOL["function"]["name"],)
_FIRST_CALL = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)
_SENTINEL = "\x00agentrl-tool-response\x00"
_UPSTREAM_TOOL_FENCE = re.compile(r"```python(.*?)```", re.DOTALL)  # CustomSandboxFusionTool.code_pattern


@dataclass(frozen=True)
class ToolCall:
    """The first tool call of a turn: ``code`` to run, or ``error`` (the tool response) when malformed.

    ``raw`` is the text between the tags (what the trajectory records for a malformed call).
    """

    raw: str
    code: Any = None
    error: str | None = None
    dropped: bool = False  # upstream's parser drops it: the trajectory ends (tool_call_parsing: upstream)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.dropped


def parse_tool_call(turn_text: str, parsing: str = "lenient") -> ToolCall | None:
    """The first ``<tool_call>`` of an assistant turn; ``None`` when the turn makes no call.

    A turn that closes a call it never opened (``</tool_call>`` without ``<tool_call>``) is a
    malformed call, not a final answer: the model asked for a tool.
    """
    if parsing == "upstream":
        return _upstream_tool_call(turn_text)
    match = _FIRST_CALL.search(turn_text)
    if match is None:
        if TOOL_CALL_END in turn_text:
            raw = turn_text.split(TOOL_CALL_END, 1)[0]
            return ToolCall(raw=raw, error=ERROR_PREFIX + f"{TOOL_CALL_END} without a {TOOL_CALL_START} before it")
        return None
    raw = match.group(1)
    try:
        return ToolCall(raw=raw, code=_code_argument(raw))
    except ValueError as exc:
        return ToolCall(raw=raw, error=ERROR_PREFIX + str(exc))


def _upstream_tool_call(turn_text: str) -> ToolCall | None:
    """HermesToolParser.extract_tool_calls, then ToolAgentLoop._call_tool and the demystify tool's
    ``execute`` up to the sandbox run, for the first call (the only one the turn holds here)."""
    match = _FIRST_CALL.search(turn_text)
    if match is None:
        if TOOL_CALL_END in turn_text:  # the parser needs both tags: no call, the trajectory ends
            return ToolCall(raw=turn_text.split(TOOL_CALL_END, 1)[0], dropped=True)
        return None
    raw = match.group(1)
    try:
        call = json.loads(raw)
        name, arguments = call["name"], call["arguments"]
    except Exception:  # noqa: BLE001 - the parser catches every exception here and drops the call
        return ToolCall(raw=raw, dropped=True)
    if not isinstance(name, str):  # FunctionCall(name=...) is a pydantic str field
        return ToolCall(raw=raw, dropped=True)
    if name not in KNOWN_TOOLS:  # self.tools[name] raises KeyError
        return ToolCall(raw=raw, error=ERROR_PREFIX + repr(name))
    try:
        code = arguments["code"]  # CustomSandboxFusionTool.execute
        _UPSTREAM_TOOL_FENCE.findall(code)  # a non-string code raises here
    except Exception as exc:  # noqa: BLE001 - _call_tool answers any exception with its text
        return ToolCall(raw=raw, error=ERROR_PREFIX + str(exc))
    return ToolCall(raw=raw, code=code)


def _code_argument(raw: str) -> Any:
    try:
        call = json.loads(raw.strip())
    except json.JSONDecodeError as exc:
        raise ValueError(f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(call, dict) or "name" not in call:
        raise ValueError('the tool call must be a JSON object {"name": ..., "arguments": {...}}')
    if call["name"] not in KNOWN_TOOLS:
        raise ValueError(f"unknown tool {call['name']!r}; available tools: {', '.join(KNOWN_TOOLS)}")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the arguments are not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(arguments, dict) or "code" not in arguments:
        raise ValueError("missing required argument 'code'")
    return arguments["code"]


class ToolTurnFormat:
    """Token ids the loop inserts around tool responses, derived from the chat template.

    - ``end_of_turn_id``: the token that ends an assistant turn (``<|im_end|>``), a stop token.
    - ``call_end_id``: the single token ``</tool_call>``, the other stop token.
    - ``response_ids(text)``: everything after ``</tool_call>`` up to the next assistant turn's
      first generated token, with ``text`` as the tool response.

    ``framing`` (``rollout.tool_turn_framing``): ``template`` cuts the full conversation's
    rendering, so the end-of-turn token is followed by the newline the template writes after
    every turn. ``upstream`` drops that newline: verl's tool agent loop renders the tool message
    on its own and appends it right after the model's ``<|im_end|>``, one token fewer per tool turn.
    """

    def __init__(self, tokenizer, framing: str = "template") -> None:
        self.tokenizer = tokenizer
        self.call_end_id = _single_token(tokenizer, TOOL_CALL_END)
        call = {"type": "function", "function": {"name": KNOWN_TOOLS[0], "arguments": {"code": "1"}}}
        messages = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "tool_calls": [call]},
            {"role": "tool", "content": _SENTINEL},
        ]
        rendered = tokenizer.apply_chat_template(
            messages, tools=[CODE_INTERPRETER_TOOL], add_generation_prompt=True, tokenize=False
        )
        assert TOOL_CALL_END in rendered, (
            f"the chat template does not render tool calls as {TOOL_CALL_START}...{TOOL_CALL_END} (hermes format)"
        )
        tail = rendered[rendered.rindex(TOOL_CALL_END) + len(TOOL_CALL_END) :]
        assert tail.count(_SENTINEL) == 1, "the chat template does not render the tool message content verbatim"
        self.before_text, self.after_text = tail.split(_SENTINEL)
        if framing == "upstream":
            self.before_text = _without_newline_after_end_of_turn(tokenizer, self.before_text)
        before_ids = self._encode(self.before_text)
        assert before_ids, "the chat template inserts nothing between a tool call and its response"
        self.end_of_turn_id = before_ids[0]
        assert self.end_of_turn_id in tokenizer.all_special_ids, (
            f"the chat template closes an assistant turn with {tokenizer.decode([self.end_of_turn_id])!r}, "
            "which is not a special token; cannot use it as the end-of-turn stop token"
        )
        specials = [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]
        head, self._lead = _cut_at_special(self.before_text, specials, last=True)
        self._trail, tail = _cut_at_special(self.after_text, specials, last=False)
        self._head_ids, self._tail_ids = self._encode(head), self._encode(tail)
        for probe in ("", "42\n", "a\n\n", "  x  \n"):
            one_pass = self._encode(self.response_text(probe))
            assert self.response_ids(probe) == one_pass, (
                f"the tool turn around {probe!r} does not tokenize as the template's rendering in one pass "
                "(a special token of the template that takes in the whitespace beside it?)"
            )

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def response_ids(self, text: str) -> list[int]:
        """The tool turn around ``text`` as the template renders it, tokenized in one pass (the
        module docstring), special tokens split inside the output's stretch of text."""
        middle = self._lead + text + self._trail
        content = self.tokenizer(middle, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return self._head_ids + content + self._tail_ids

    def response_text(self, text: str) -> str:
        return self.before_text + text + self.after_text

    @property
    def stop_token_ids(self) -> tuple[int, int]:
        return (self.end_of_turn_id, self.call_end_id)


def _cut_at_special(text: str, specials: list[str], last: bool) -> tuple[str, str]:
    """``text`` cut right after its last (``last``) or right before its first special token:
    special tokens are where a tokenizer splits the text before BPE, so the pieces tokenize apart
    exactly as within the whole."""
    if last:
        cut = max((text.rindex(s) + len(s) for s in specials if s in text), default=0)
    else:
        cut = min((text.index(s) for s in specials if s in text), default=len(text))
    return text[:cut], text[cut:]


def _without_newline_after_end_of_turn(tokenizer, before_text: str) -> str:
    """``<|im_end|>\\n<|im_start|>user...`` -> ``<|im_end|><|im_start|>user...``."""
    end_of_turn = tokenizer.decode(tokenizer.encode(before_text, add_special_tokens=False)[:1])
    assert before_text.startswith(end_of_turn), f"{before_text!r} does not start with {end_of_turn!r}"
    rest = before_text[len(end_of_turn) :]
    return end_of_turn + rest.removeprefix("\n")


def _single_token(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (
        f"{text!r} is {len(ids)} tokens for this tokenizer; the agent loop stops generation on it and "
        "needs it to be one token (it is in Qwen2.5/Qwen3 and in the embedded tokenizer)"
    )
    return ids[0]
