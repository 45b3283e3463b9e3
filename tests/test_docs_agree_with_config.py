"""What the docs and the config files' comments state about the config, read against the config itself.

A default named in the docs (```grpo.keep_checkpoints: 2`, the default``) must be the schema's, and
a step count in a comment (``18 conversations, 2 steps of 8``) what the trainer runs with that file's
values; both went stale before (docs/operations.md named 2 checkpoints "the default of both
trainers", SFT's is 1; presets/smoke.yaml said "3 steps of 8" where SFT runs 2).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from helpers.presets import PRESETS, resolved
from helpers.workflows import ROOT

from agentrl.config import load_config
from agentrl.sft.batching import steps_per_epoch

# The docs that describe the project as it is; results.md and experiments.md are dated logs, whose
# "the default then" statements are history.
CURRENT_DOCS = [ROOT / "README.md", *(ROOT / "docs" / name for name in ("operations.md", "paper-scale.md",
                "design.md", "fidelity.md", "recipe.md"))]  # fmt: skip
# `section.key: value`, the default  |  `section.key: value` (the default)
DEFAULT_STATEMENT = re.compile(
    r"`((?:[a-z0-9_]+\.)+[a-z0-9_]+): ([^`]+)`(?:,| \()\s*(?:the|its)\s+default\b(?!\s+(?:then|from|before))"
)
# `key: value`, the default, with no section: which section's default it is cannot be told
UNQUALIFIED_DEFAULT = re.compile(r"`([a-z0-9_]+): ([^`]+)`(?:,| \()\s*(?:the|its)\s+default\b")


def _default(key: str):
    value = load_config({})
    for part in key.split("."):
        value = getattr(value, "from_" if part == "from" else part)
    return value


def _statements() -> list[tuple[str, str, str]]:
    found = []
    for doc in CURRENT_DOCS:
        text = " ".join(doc.read_text(encoding="utf-8").split())  # a statement may wrap across lines
        found += [(doc.name, key, value) for key, value in DEFAULT_STATEMENT.findall(text)]
    return found


def test_every_default_the_docs_name_is_the_schemas():
    statements = _statements()
    assert ("operations.md", "grpo.keep_checkpoints", "2") in statements, "the reader finds the statements"
    wrong = [
        f"{doc}: `{key}: {value}` is called the default, the schema's is {_default(key)!r}"
        for doc, key, value in statements
        if yaml.safe_load(value) != _default(key)
    ]
    assert wrong == [], wrong


def test_no_doc_calls_a_value_the_default_without_its_section():
    unqualified = [
        f"{doc.name}: `{key}: {value}`"
        for doc in CURRENT_DOCS
        for key, value in UNQUALIFIED_DEFAULT.findall(" ".join(doc.read_text(encoding="utf-8").split()))
    ]
    assert unqualified == [], f"name the section (sft. or grpo.): {unqualified}"


# --------------------------------------------------------------------------- step counts in the config files' comments
def _comments(path: Path) -> dict[str, str]:
    """Dotted key -> the comment on its line, for the block-style mappings the config files use."""
    comments, stack = {}, []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^( *)([a-z0-9_]+):[^#]*#\s*(.*)$", line) or re.match(r"^( *)([a-z0-9_]+):", line)
        if match is None:
            continue
        depth = len(match.group(1)) // 2
        stack = [*stack[:depth], match.group(2)]
        if match.lastindex == 3:
            comments[".".join(stack)] = match.group(3)
    return comments


def _needs(name: str) -> list[str]:
    """The presets a preset is an overlay on, in load order, then the preset itself."""
    declared = (yaml.safe_load((PRESETS / f"{name}.yaml").read_text()) or {}).get("presets", {}).get(name) or []
    return [preset for need in declared for preset in _needs(need)] + [name]


CONFIG_FILES = ["config.yaml", *sorted(p.name for p in PRESETS.glob("*.yaml"))]


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_the_step_counts_in_a_config_files_comments_are_what_sft_runs(name):
    path = ROOT / name if name == "config.yaml" else PRESETS / name
    cfg = resolved() if name == "config.yaml" else resolved(*(f"{n}.yaml" for n in _needs(name[: -len(".yaml")])))
    if cfg.data.source != "embedded":
        pytest.skip("the conversation count of upstream data is the hub file's")
    embedded, pretrain = cfg.data.embedded, cfg.model.embedded.pretrain
    sft_conversations = embedded.sft_per_family * len(embedded.families)
    # key of the commented line -> (conversations, global batch, epochs) of the run it describes
    runs = {
        "sft.epochs": (sft_conversations, cfg.sft.global_batch_size, cfg.sft.epochs),
        "model.embedded.pretrain.conversations": (pretrain.conversations, pretrain.global_batch_size, pretrain.epochs),
        "model.embedded.pretrain.epochs": (pretrain.conversations, pretrain.global_batch_size, pretrain.epochs),
    }
    for key, comment in _comments(path).items():
        if key not in runs:
            continue
        conversations, batch, epochs = runs[key]
        steps = steps_per_epoch(conversations, batch) * epochs
        for stated in re.findall(r"(\d+) conversations", comment):
            assert int(stated) == conversations, f"{name} {key}: {comment!r}, the data has {conversations}"
        for stated, of in re.findall(r"(\d+) steps(?: of (\d+))?", comment):
            assert int(stated) == steps, f"{name} {key}: {comment!r}, the trainer runs {steps} steps"
            assert not of or int(of) == batch, f"{name} {key}: {comment!r}, the batch is {batch}"
