"""The SFT loss mask: exactly the assistant content, tool-call text and <|im_end|> are trained."""

from __future__ import annotations

import json

import pytest

from agentrl.data.prompts import CODE_INTERPRETER_TOOL
from agentrl.model.build import train_tokenizer
from agentrl.sft.masking import render_with_assistant_mask

CONVERSATION = [
    {"role": "system", "content": "You are precise."},
    {"role": "user", "content": "Compute 17 * 23, then box it."},
    {
        "role": "assistant",
        "content": "Let me compute it.",
        "tool_calls": [
            {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": "print(17 * 23)"}}}
        ],
    },
    {"role": "tool", "content": "391\n"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "code_interpreter", "arguments": json.dumps({"code": "print(391 + 0)"})},
            }
        ],
    },
    {"role": "tool", "content": "391\n"},
    {"role": "user", "content": "Sure?"},
    {"role": "assistant", "content": "Yes.\n\\boxed{391}"},
]

EXPECTED_TRAINED = [
    'Let me compute it.\n<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(17 * 23)"}}\n'
    "</tool_call><|im_end|>",
    '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(391 + 0)"}}\n</tool_call><|im_end|>',
    "Yes.\n\\boxed{391}<|im_end|>",
]


@pytest.fixture(scope="module")
def tokenizer():
    corpus = ["Let me compute it with the tool. The answer is \\boxed{391}. print(17 * 23)"] * 20
    return train_tokenizer(corpus, 400, "qwen3")


def _runs(ids: list[int], mask: list[int], value: int) -> list[list[int]]:
    runs, current = [], []
    for token, bit in zip(ids, mask):
        if bit == value:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def test_exactly_the_assistant_turns_are_trained(tokenizer):
    ids, mask = render_with_assistant_mask(tokenizer, CONVERSATION, [CODE_INTERPRETER_TOOL])
    assert len(ids) == len(mask) and set(mask) == {0, 1}
    trained = [tokenizer.decode(run, skip_special_tokens=False) for run in _runs(ids, mask, 1)]
    assert trained == EXPECTED_TRAINED


def test_untrained_tokens_hold_headers_system_user_and_tool_text(tokenizer):
    ids, mask = render_with_assistant_mask(tokenizer, CONVERSATION, [CODE_INTERPRETER_TOOL])
    untrained = [tokenizer.decode(run, skip_special_tokens=False) for run in _runs(ids, mask, 0)]
    assert untrained[0].startswith("<|im_start|>system\nYou are precise.\n\n# Tools")
    assert untrained[0].endswith("Compute 17 * 23, then box it.<|im_end|>\n<|im_start|>assistant\n")
    assert (
        untrained[1]
        == "\n<|im_start|>user\n<tool_response>\n391\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert untrained[2] == (
        "\n<|im_start|>user\n<tool_response>\n391\n\n</tool_response><|im_end|>\n"
        "<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert untrained[3] == "\n"
    # nothing lost or added: the pieces are the template's rendering, token for token
    full = tokenizer.apply_chat_template(CONVERSATION, tools=[CODE_INTERPRETER_TOOL], tokenize=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == full


def test_without_tools_there_is_no_tool_block(tokenizer):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    ids, mask = render_with_assistant_mask(tokenizer, messages, [])
    assert [tokenizer.decode(r, skip_special_tokens=False) for r in _runs(ids, mask, 1)] == ["Hello.<|im_end|>"]
    assert tokenizer.decode(ids, skip_special_tokens=False).startswith("<|im_start|>user\nHi")


def test_bad_conversations_are_refused_with_the_message_named(tokenizer):
    with pytest.raises(ValueError, match="message 1: role 'robot'"):
        render_with_assistant_mask(tokenizer, [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}], [])
    with pytest.raises(ValueError, match="message 0 is an assistant turn"):
        render_with_assistant_mask(tokenizer, [{"role": "assistant", "content": "a"}], [])
    with pytest.raises(ValueError, match="message 1: an assistant turn with neither"):
        render_with_assistant_mask(
            tokenizer, [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}], []
        )


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer):
    tokenizer = train_tokenizer(["abc"], 300, "qwen3")
    # a template that writes the turn count first: every prefix renders differently
    tokenizer.chat_template = (
        "{{ messages | length }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    with pytest.raises(ValueError, match="does not render this conversation incrementally"):
        render_with_assistant_mask(tokenizer, messages, [])
