"""docs/extending.md does what it says: each section's example run as written, in a fresh folder.

A block captioned `` `name`: `` is written to that file, a ``bash`` block is run there (the
package of this checkout first on the path), and a ``text`` block must be exactly the last
lines the ``bash`` block before it printed. Each test then checks what the section's prose promises
beyond its printout: the files the stage wrote, the error a broken input gets, what the
workflow plans with the section's overlay.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.workflows import ROOT, run_snakemake

from agentrl.config import load_config_file
from agentrl.data.records import read_problems
from agentrl.errors import ModelFolderError
from agentrl.model.folder import resolve_pretrained
from agentrl.rewards import registry

DOC = ROOT / "docs" / "extending.md"
CAPTION = re.compile(r"^`([^`\s]+)`:$")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    lang: str
    body: str
    file: str | None  # the caption's file name: a file to write


def section_blocks(title: str) -> list[Block]:
    """The fenced blocks of the doc's ``## title`` section, in order."""
    sections = re.split(r"^## ", DOC.read_text(encoding="utf-8"), flags=re.M)
    matching = [s for s in sections if s.startswith(title + "\n")]
    assert len(matching) == 1, f"{DOC} has no single section '## {title}'"
    blocks, lang, body, caption, last_line = [], None, [], None, ""
    for line in matching[0].splitlines():
        fence = FENCE.match(line)
        if lang is None and fence:
            lang, body = fence.group(1), []
            caption = CAPTION.match(last_line)
        elif lang is not None and line == "```":
            blocks.append(Block(lang, "\n".join(body) + "\n", caption.group(1) if caption else None))
            lang = None
        elif lang is not None:
            body.append(line)
        if line.strip():
            last_line = line.strip()
    assert lang is None, f"{DOC}, section {title}: a block is not closed"
    return blocks


def _env(folder: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # `python` is this interpreter
        "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(folder / ".datasets-cache"),
    }


def run_section(title: str, folder: Path) -> list[str]:
    """Write the section's files and run its commands in ``folder``; returns what each printed."""
    printed: list[str] = []
    for block in section_blocks(title):
        if block.file is not None:
            (folder / block.file).parent.mkdir(parents=True, exist_ok=True)
            (folder / block.file).write_text(block.body, encoding="utf-8")
        elif block.lang == "bash":
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.body],
                cwd=folder,
                env=_env(folder),
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"{title}: {block.body}\n{done.stderr[-3000:]}"
            printed.append(done.stdout)
        elif block.lang == "text":
            assert printed, f"{title}: a text block with no command before it"
            # the end of it: a library may print a line of its own first (DeepSpeed's accelerator)
            lines, shown = printed[-1].rstrip("\n").split("\n"), block.body.rstrip("\n").split("\n")
            assert lines[-len(shown) :] == shown, f"{title}: the doc shows another output than\n{printed[-1]}"
    return printed


def test_the_doc_names_the_four_sections_and_links_from_the_readme():
    for title in ("Your own data set", "Your own reward", "Your own tool", "Your own base model"):
        assert any(b.lang == "bash" for b in section_blocks(title)), f"{title}: nothing to run"
    assert "(docs/extending.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_your_own_data_set(tmp_path):
    run_section("Your own data set", tmp_path)
    (evaluation,) = read_problems(tmp_path / "out" / "eval" / "aime2025.parquet")
    assert (evaluation.ground_truth, evaluation.data_source) == ("56", "AIME2025")
    assert "What is 7 * 8?" in evaluation.prompt[0]["content"], "the aime2025 loader's wrapping of the question"
    sft = pq.read_table(tmp_path / "out" / "sft.parquet").to_pylist()
    assert len(sft) == 1 and "391" in json.dumps(sft[0])

    # "A row that breaks the schema stops prepare-data with the file, row and column."
    rows = pq.read_table(tmp_path / "my-data" / "rl.parquet").to_pylist()
    rows[1]["prompt"] = [{"role": "user", "content": "  "}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "my-data" / "rl.parquet")
    command = (
        "python -m agentrl prepare-data --config my-data.yaml --sft o/s.parquet --rl-pool o/r.parquet --eval-dir o/e"
    )
    done = subprocess.run(command.split(), cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "my-data/rl.parquet: row 1, column 'prompt'" in done.stderr, done.stderr[-2000:]


def test_your_own_reward(tmp_path):
    run_section("Your own reward", tmp_path)
    # what the workflow needs instead: the two tables of the registry the prose names
    assert isinstance(registry.VERIFIER_FACTORIES, dict) and "math" in registry.VERIFIER_FACTORIES
    assert registry.SourceRule("gpqa*", "multiple_choice") in registry.BUILTIN_SOURCE_RULES
    # "the workflow's jobs are new processes that import only the package": they do not know it
    command = "python -m agentrl reward --data-source physics-pendulum --ground-truth 9.81 --response-file -"
    done = subprocess.run(
        command.split(), input="\\boxed{9.8}", cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True
    )
    assert done.returncode == 2 and "no reward verifier for data_source 'physics-pendulum'" in done.stderr


def test_your_own_tool(tmp_path):
    run_section("Your own tool", tmp_path)
    sandbox = load_config_file(tmp_path / "remote-sandbox.yaml").sandbox
    assert (sandbox.backend, sandbox.sandbox_fusion_url) == ("sandbox_fusion", "http://sandbox-host:8080")


def test_your_own_base_model(tmp_path):
    run_section("Your own base model", tmp_path)
    assert json.loads((tmp_path / "my-model" / "config.json").read_text())["model_type"] == "qwen3"

    # the workflow with the overlay: the base model linked, no copying pretraining planned
    (tmp_path / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    planned = run_snakemake(tmp_path, "-n", "--configfile", "config.yaml", "my-model.yaml", timeout=180)
    assert planned.returncode == 0, planned.stderr[-3000:]
    jobs = re.findall(r"^(?:local)?rule (\w+):$", planned.stdout, flags=re.M)
    assert "base_model" in jobs and "sft" in jobs and not {"pretrain", "copy_corpus"} & set(jobs)

    # "a folder without weights, tokenizer or chat template is refused, naming what is missing"
    (tmp_path / "my-model" / "chat_template.jinja").unlink()
    with pytest.raises(ModelFolderError, match="has no chat template"):
        resolve_pretrained(str(tmp_path / "my-model"), tmp_path / "refused")
