"""Hub sources through a pre-filled hub cache, offline: revision pins reach the loaders.

The cache is built by hand in the layout huggingface_hub reads (``<kind>s--<org>--<name>/
snapshots/<commit>/<file>``, ``refs/main``), from the fixture files, which have the paths of the
released data sets. Every run sets HF_HUB_OFFLINE=1 and points HF_ENDPOINT at a closed port, so
any network call would fail the test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agentrl.hub import is_hub_id
from agentrl.hub_ids import path_typo

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
PIN = "1" * 40
OTHER = "2" * 40
DATA = {
    "Gen-Verse/Open-AgentRL-SFT-3K": {"full_sft_3k_shuffled_v4.parquet": FIXTURES / "sft.parquet"},
    "Gen-Verse/Open-AgentRL-30K": {"Open-AgentRL-30K.parquet": FIXTURES / "rl.parquet"},
    "Gen-Verse/Open-AgentRL-Eval": {
        str(p.relative_to(FIXTURES / "eval")): p for p in sorted((FIXTURES / "eval").rglob("*.parquet"))
    },
}


def _put(cache: Path, kind: str, repo: str, commit: str, files: dict[str, Path | bytes], main: bool = True) -> None:
    folder = cache / f"{kind}s--{repo.replace('/', '--')}"
    for name, content in files.items():
        target = folder / "snapshots" / commit / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            shutil.copyfile(content, target)
    if main:
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text(commit)


def _offline_env(cache: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}",
        "HF_HUB_CACHE": str(cache),
        "HF_HOME": str(cache.parent / "hf_home"),
        "HF_HUB_OFFLINE": "1",
        "HF_ENDPOINT": "http://127.0.0.1:9",  # closed: a network call would fail
    }


def _upstream(revision: str | None) -> dict:
    def source(repo: str, file: str) -> dict:
        return {"id": repo, "file": file, "revision": revision}

    return {
        "source": "upstream",
        "upstream": {
            "sft": source("Gen-Verse/Open-AgentRL-SFT-3K", "full_sft_3k_shuffled_v4.parquet"),
            "rl": source("Gen-Verse/Open-AgentRL-30K", "Open-AgentRL-30K.parquet"),
            "eval": {
                "aime2024": source("Gen-Verse/Open-AgentRL-Eval", "aime2024/aime_2024_problems.parquet"),
                "gpqa_diamond": source("Gen-Verse/Open-AgentRL-Eval", "gpqa-diamond/gpqa_diamond.parquet"),
            },
        },
    }


def _run(args: list[str], cache: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentrl", *args], cwd=cwd, env=_offline_env(cache), capture_output=True, text=True
    )


def test_offline_prepare_data_reads_the_pinned_fixture_datasets_from_the_cache(tmp_path):
    cache = tmp_path / "hub"
    for repo, files in DATA.items():
        _put(cache, "dataset", repo, PIN, files)
    cfg = json.dumps({"data": _upstream(PIN)})
    done = _run(
        ["prepare-data", "--config-json", cfg, "--sft", "sft.parquet", "--rl-pool", "rl.parquet", "--eval-dir", "eval"],
        cache,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert pq.read_table(tmp_path / "rl.parquet").num_rows == pq.read_table(FIXTURES / "rl.parquet").num_rows
    assert pq.read_table(tmp_path / "sft.parquet").num_rows == pq.read_table(FIXTURES / "sft.parquet").num_rows
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == ["aime2024.parquet", "gpqa_diamond.parquet"]


def test_the_revision_pin_decides_which_snapshot_is_read(tmp_path):
    """Two snapshots of the RL set: main has 2 rows, the pinned commit all of them."""
    cache = tmp_path / "hub"
    full = pq.read_table(FIXTURES / "rl.parquet")
    short = tmp_path / "short.parquet"
    pq.write_table(full.slice(0, 2), short)
    _put(
        cache,
        "dataset",
        "Gen-Verse/Open-AgentRL-30K",
        PIN,
        {"Open-AgentRL-30K.parquet": FIXTURES / "rl.parquet"},
        main=False,
    )
    _put(cache, "dataset", "Gen-Verse/Open-AgentRL-30K", OTHER, {"Open-AgentRL-30K.parquet": short})
    probe = (
        "import sys; from agentrl.config import SourceConfig; from agentrl.data.upstream import read_rows; "
        "rev = sys.argv[1] or None; "
        "print(len(read_rows(SourceConfig('Gen-Verse/Open-AgentRL-30K', 'Open-AgentRL-30K.parquet', rev))))"
    )
    counts = {}
    for revision in (PIN, OTHER, ""):
        done = subprocess.run(
            [sys.executable, "-c", probe, revision], env=_offline_env(cache), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        counts[revision] = int(done.stdout.split()[-1])
    assert counts == {PIN: full.num_rows, OTHER: 2, "": 2}  # "" = null: the default branch


def _model_files(tag: str) -> dict[str, bytes]:
    """A model folder that passes base-model's folder check (config, a safetensors file whose header
    names ``tag``, a tokenizer with a chat template); no weight is ever loaded."""
    config = json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}).encode()
    header = json.dumps({"__metadata__": {"tag": tag}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})
    weights = len(header).to_bytes(8, "little") + header.encode() + bytes(4)
    template = b"{% for m in messages %}{{ m.content }}{% endfor %}"
    return {
        "config.json": config,
        "model.safetensors": weights,
        "tokenizer.json": b"{}",
        "chat_template.jinja": template,
    }


def test_offline_base_model_and_hub_download_use_the_pinned_model_snapshot(tmp_path):
    cache = tmp_path / "hub"
    _put(cache, "model", "acme/tiny", PIN, _model_files("pinned"), main=False)
    _put(cache, "model", "acme/tiny", OTHER, _model_files("newer"))
    cfg = json.dumps({"model": {"base": "acme/tiny", "revision": PIN}, "data": _upstream(PIN)})
    for repo, files in DATA.items():
        _put(cache, "dataset", repo, PIN, files)

    done = _run(["hub-download", "--config-json", cfg, "--manifest", "manifest.json"], cache, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["model.base"] == {"id": "acme/tiny", "file": None, "revision": PIN, "commit": PIN}
    assert manifest["data.upstream.rl"]["commit"] == PIN and len(manifest) == 5

    done = _run(["base-model", "--config-json", cfg, "--out", "base"], cache, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "base" / "model.safetensors").read_bytes() == _model_files("pinned")["model.safetensors"]
    assert "agentrl_model_sha256" in json.loads((tmp_path / "base" / "config.json").read_text())


def test_an_uncached_file_offline_is_an_error_naming_it(tmp_path):
    cfg = json.dumps({"data": _upstream(PIN)})
    done = _run(
        ["prepare-data", "--config-json", cfg, "--sft", "s.parquet", "--rl-pool", "r.parquet", "--eval-dir", "e"],
        tmp_path / "empty-cache",
        tmp_path,
    )
    assert done.returncode != 0 and "full_sft_3k_shuffled_v4.parquet" in done.stderr


def test_hub_ids_and_local_paths(tmp_path):
    assert is_hub_id("Gen-Verse/Open-AgentRL-30K")
    assert not is_hub_id(str(FIXTURES / "rl.parquet"))
    assert not is_hub_id("data/rl.parquet")
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert not is_hub_id(str(tmp_path / "org" / "model"))
    assert not is_hub_id("embedded")


# name -> whether it is refused as a mistyped local path (in a folder holding models/ and data.parquet)
PATH_TYPOS = {
    "Qwen/Qwen3-8B": False,  # owner/name: a hub id
    "embedded": False,  # no '/': left to the key's reader
    "data.parquet": False,  # exists here
    "models": False,  # exists here
    "./models/qwen": True,
    "../models/qwen": True,
    "/data/x": True,
    "~/nowhere/qwen": True,
    "results/models/sft": True,  # two '/': no hub id
    "models/Qwen3": True,  # models/ exists here: a local path
    "Models/Qwen3": False,  # no folder Models/ here: a hub id
}


@pytest.mark.parametrize("name", sorted(PATH_TYPOS))
def test_a_source_spelled_as_a_missing_local_path_is_a_typo_not_a_hub_id(tmp_path, monkeypatch, name):
    (tmp_path / "models").mkdir()
    (tmp_path / "data.parquet").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert (path_typo(name) is not None) == PATH_TYPOS[name], path_typo(name)
