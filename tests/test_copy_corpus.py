"""The copying corpus of the embedded model's pretraining: every trained line is a named copy,
the corpus is a pure function of the seed, and SFT's masking trains on the copies only."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from agentrl.data.copy_corpus import NAMES, WRAPPERS, copy_corpus
from agentrl.data.embedded import choice_conclusion
from agentrl.data.records import read_sft_examples
from agentrl.sft.batching import tokenize_examples


def test_every_assistant_line_copies_a_named_span_once():
    for example in copy_corpus(200, seed=3, max_spans=4):
        user, assistant = example.messages
        assert (user["role"], assistant["role"]) == ("user", "assistant") and example.tools == []
        named = dict(line.split(": ", 1) for line in user["content"].splitlines())
        assert 2 <= len(named) <= 4 and list(named) == list(NAMES[: len(named)])
        lines = assistant["content"].splitlines()
        assert sorted(line.split(" ", 1)[0] for line in lines) == sorted(named), "each span copied exactly once"
        for line in lines:
            name = line.split(" ", 1)[0]
            assert any(line == f"{name} " + wrapper.format(named[name]) for wrapper in WRAPPERS), (line, named)


def test_spans_are_expressions_options_numbers_and_words():
    spans = [line.split(": ", 1)[1] for e in copy_corpus(400, 0, 3) for line in e.messages[0]["content"].splitlines()]
    kinds = {
        "options": sum(s.startswith("A=") for s in spans),
        "number": sum(bool(re.fullmatch(r"-?\d+", s)) for s in spans),
        "word": sum(s.isalpha() for s in spans),
        "expression": sum(bool(re.search(r"\d[-+*]", s)) and not s.startswith("A=") for s in spans),
    }
    assert all(count > 0.05 * len(spans) for count in kinds.values()), kinds


def test_the_same_seed_gives_the_same_corpus_and_another_seed_another():
    assert copy_corpus(50, 1, 3) == copy_corpus(50, 1, 3)
    assert copy_corpus(50, 1, 3) != copy_corpus(50, 2, 3)


def test_a_verbatim_share_repeats_the_user_turn_and_share_0_never_does():
    plain = copy_corpus(300, 4, 3)
    assert not any(e.messages[1]["content"] == e.messages[0]["content"] for e in plain)
    mixed = copy_corpus(300, 4, 3, verbatim_share=0.3)
    verbatim = [e for e in mixed if e.messages[1]["content"] == e.messages[0]["content"]]
    assert 0.2 < len(verbatim) / len(mixed) < 0.4
    # the others are named copies in wrappers, as without the share
    for example in mixed:
        if example not in verbatim:
            assert all(line.split(" ", 1)[0] in NAMES for line in example.messages[1]["content"].splitlines())


def test_a_verbatim_share_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="verbatim_share"):
        copy_corpus(1, 0, 3, verbatim_share=1.5)


def test_a_letter_share_copies_a_printed_letter_list_as_the_choice_answer_and_share_0_never_does():
    def letter_spans(example):
        named = dict(line.split(": ", 1) for line in example.messages[0]["content"].splitlines())
        return {name: span for name, span in named.items() if re.fullmatch(r"\['[A-D]'\]", span)}

    assert not any(letter_spans(e) for e in copy_corpus(300, 4, 3, verbatim_share=0.3))
    mixed = copy_corpus(400, 4, 3, verbatim_share=0.3, letter_share=0.5)
    with_letter = [e for e in mixed if letter_spans(e)]
    assert 0.4 < len(with_letter) / len(mixed) < 0.6
    for example in with_letter:
        ((name, span),) = letter_spans(example).items()
        user, assistant = example.messages[0]["content"], example.messages[1]["content"]
        if assistant == user:
            continue  # a verbatim conversation copies the list as it stands
        # the tool's printing of the letter, ['C'], answered as the choice trajectories answer it
        assert f"{name} {choice_conclusion(span[2])}" in assistant
        assert f"{name} Option {span[2]} matches." in assistant and span not in assistant


def test_a_letter_share_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="letter_share"):
        copy_corpus(1, 0, 3, letter_share=-0.1)


def test_max_spans_outside_the_names_is_refused():
    with pytest.raises(ValueError, match="max_spans"):
        copy_corpus(1, 0, len(NAMES) + 1)


def test_the_stage_writes_an_sft_parquet_whose_trained_tokens_are_the_copies(tmp_path, random_policy_dir):
    out = tmp_path / "copy_corpus.parquet"
    config = tmp_path / "config.yaml"
    config.write_text(
        "model:\n  embedded:\n    pretrain: {conversations: 12, max_spans: 2, verbatim_share: 0.5, letter_share: 0.5}\n"
    )
    subprocess.run(
        [sys.executable, "-m", "agentrl", "copy-corpus", "--config", str(config), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    examples = read_sft_examples(out)
    assert len(examples) == 12 and examples == copy_corpus(12, 0, 2, verbatim_share=0.5, letter_share=0.5)
    tokenizer = AutoTokenizer.from_pretrained(random_policy_dir)
    tokenized = tokenize_examples(examples, tokenizer, 1024, "right", source=str(out), loss_mask_alignment="target")
    for example, tokens in zip(examples, tokenized):
        trained = [t for t, m in zip(tokens.input_ids, tokens.loss_mask) if m]
        assert tokenizer.decode(trained) == example.messages[1]["content"] + "<|im_end|>"
