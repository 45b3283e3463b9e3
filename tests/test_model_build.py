"""The embedded base model: a Qwen3 folder with a tokenizer that reads numbers in two-digit chunks and
renders tool calls the way Qwen3's template does."""

from __future__ import annotations

import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.config import load_config
from agentrl.data.prompts import CODE_INTERPRETER_TOOL
from agentrl.errors import ModelFolderError
from agentrl.model.build import chat_template, count_parameters, resolve_pretrained, save_embedded_model
from agentrl.model.folder import MODEL_DIGEST_KEY, model_digest, stamp_model_digest

CONVERSATION = [
    {"role": "user", "content": "Compute 4821 * 37 - 9156."},
    {
        "role": "assistant",
        "content": "Let me compute it.",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "code_interpreter", "arguments": {"code": "print(4821 * 37 - 9156)"}},
            }
        ],
    },
    {"role": "tool", "content": "169221\n"},
    {"role": "assistant", "content": "The result is 169221.\n\\boxed{169221}"},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("model") / "base"
    from agentrl.model.build import train_tokenizer

    renderer = train_tokenizer(["0123456789"], 300, "qwen3")
    text = renderer.apply_chat_template(CONVERSATION, tools=[CODE_INTERPRETER_TOOL], tokenize=False)
    save_embedded_model([text] * 20, load_config({}).model.embedded, seed=0, out_dir=out)
    return out


def test_folder_loads_as_a_hugging_face_model(model_dir):
    assert (model_dir / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert model.config.model_type == "qwen3"
    assert 1_000_000 < count_parameters(model) < 5_000_000
    assert model.config.vocab_size == len(tokenizer)
    ids = tokenizer("hello", return_tensors="pt").input_ids
    assert model(ids).logits.shape == (1, ids.shape[1], len(tokenizer))
    assert tokenizer.chat_template == chat_template(load_config({}).model.embedded.tool_header)


@pytest.mark.parametrize("tool_header", ["compact", "qwen3"])
def test_chat_template_renders_hermes_tool_calls_and_responses(model_dir, tool_header):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = chat_template(tool_header)
    text = tokenizer.apply_chat_template(CONVERSATION, tools=[CODE_INTERPRETER_TOOL], tokenize=False)
    if tool_header == "qwen3":
        assert text.startswith("<|im_start|>system\n# Tools\n")
        assert "<tools>\n" + json.dumps(CODE_INTERPRETER_TOOL) + "\n</tools>" in text
    else:
        assert text.startswith("<|im_start|>system\nTools: code_interpreter<|im_end|>\n<|im_start|>user\n")
    # a system message keeps its place before the tools in either header
    with_system = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, *CONVERSATION], tools=[CODE_INTERPRETER_TOOL], tokenize=False
    )
    assert with_system.startswith("<|im_start|>system\nBe brief.\n\n")
    assert with_system.count("<|im_start|>system") == 1
    assert (
        'Let me compute it.\n<tool_call>\n{"name": "code_interpreter", "arguments": '
        '{"code": "print(4821 * 37 - 9156)"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert "<|im_start|>user\n<tool_response>\n169221\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text
    prompt = tokenizer.apply_chat_template(
        CONVERSATION[:1], tools=[CODE_INTERPRETER_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>user\nCompute 4821 * 37 - 9156.<|im_end|>\n<|im_start|>assistant\n")


def test_numbers_are_two_digit_tokens_from_the_left_and_text_round_trips(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer("x = 169221 + 7 -05", add_special_tokens=False).input_ids
    pieces = [tokenizer.decode([i]) for i in ids]
    assert [p for p in pieces if p.strip().isdigit()] == ["16", "92", "21", "7", "05"]
    # every chunk 00-99 is one token, whatever the corpus held (this corpus has few numbers)
    assert all(len(tokenizer(f"{i:02d}", add_special_tokens=False).input_ids) == 1 for i in range(100))
    text = tokenizer.apply_chat_template(CONVERSATION, tools=[CODE_INTERPRETER_TOOL], tokenize=False)
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids) == text


def test_tool_markers_are_single_tokens_kept_when_decoding(model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for marker in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<|im_end|>"):
        assert len(tokenizer(marker, add_special_tokens=False).input_ids) == 1, marker
    ids = tokenizer("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False).input_ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"
    assert tokenizer.eos_token == "<|im_end|>"


def test_same_seed_same_weights(tmp_path, model_dir):
    again = tmp_path / "again"
    from agentrl.model.build import train_tokenizer

    renderer = train_tokenizer(["0123456789"], 300, "qwen3")
    text = renderer.apply_chat_template(CONVERSATION, tools=[CODE_INTERPRETER_TOOL], tokenize=False)
    save_embedded_model([text] * 20, load_config({}).model.embedded, seed=0, out_dir=again)
    first = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    second = AutoModelForCausalLM.from_pretrained(again).state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_local_folder_is_linked_and_bad_names_are_refused(tmp_path, model_dir):
    out = resolve_pretrained(str(model_dir), tmp_path / "models" / "base")
    assert out.is_dir() and not out.is_symlink()
    assert (out / "model.safetensors").is_symlink()
    assert (out / "model.safetensors").resolve() == (model_dir / "model.safetensors").resolve()
    assert not (out / "config.json").is_symlink()
    assert json.loads((out / "config.json").read_text())[MODEL_DIGEST_KEY] == model_digest(model_dir)
    assert AutoModelForCausalLM.from_pretrained(out) is not None
    resolve_pretrained(str(model_dir), out)  # a re-run replaces the folder it made
    with pytest.raises(ModelFolderError, match="neither an existing folder nor a hub id"):
        resolve_pretrained("./no/such/model/here", tmp_path / "x")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelFolderError, match="no config.json"):
        resolve_pretrained(str(empty), tmp_path / "y")
    (tmp_path / "results").mkdir()
    here = os.getcwd()
    os.chdir(tmp_path)
    try:  # "results/base" spells a hub id too; with results/ present it was looked up on the hub
        with pytest.raises(ModelFolderError, match="read as a local path, not a hub id"):
            resolve_pretrained("results/base", tmp_path / "z")
    finally:
        os.chdir(here)


def test_new_weights_change_config_json_and_same_weights_do_not(tmp_path, model_dir):
    """Snakemake skips consumers of an input whose checksum is unchanged: config.json must follow the weights."""
    stamped = json.loads((model_dir / "config.json").read_text())
    assert stamped[MODEL_DIGEST_KEY] == model_digest(model_dir)
    first = (model_dir / "config.json").read_bytes()
    assert stamp_model_digest(model_dir) == stamped[MODEL_DIGEST_KEY]
    assert (model_dir / "config.json").read_bytes() == first  # same weights: same bytes, nothing re-runs

    copy = tmp_path / "retrained"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        next(model.parameters()).add_(1e-3)
    model.save_pretrained(copy)
    stamp_model_digest(copy)
    assert (copy / "config.json").read_bytes() != first


def test_a_new_tokenizer_changes_config_json_and_other_files_do_not(tmp_path, model_dir):
    """The embedded base model's weights depend on the seed only; new data means a new tokenizer."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    before = stamp_model_digest(copy)
    (copy / "global_step3.pt").write_bytes(b"deepspeed state")  # checkpoint folders hold these
    (copy / "README.md").write_text("notes")
    assert stamp_model_digest(copy) == before
    tokenizer = json.loads((copy / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = tokenizer["added_tokens"][:-1]
    (copy / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert stamp_model_digest(copy) != before


def test_model_digest_refuses_a_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelFolderError, match="no weight files"):
        stamp_model_digest(tmp_path)
