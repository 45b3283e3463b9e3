"""Released models as sources: ``sft.from`` and ``eval.checkpoints`` entries given as ``{id, revision}``.

``python -m agentrl fetch-model`` links a local folder or takes a hub snapshot from the Hugging Face
cache. There is no network here: the hub path is exercised offline (``HF_HUB_OFFLINE=1``) on a
cache laid out as ``snapshot_download`` leaves it, holding a tiny model built by the package's
own builder; the revision asked for must reach the cache look-up and the commit must be recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.released import build_fixture_model

from agentrl.config import ConfigError, ModelSourceConfig, load_config
from agentrl.model.folder import MODEL_DIGEST_KEY, MODEL_SOURCE_KEY, model_digest

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_fixture_model(tmp_path_factory.mktemp("released") / "tiny", seed=0)


def fetch_model(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentrl", "fetch-model", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})},
    )


def test_sources_are_a_string_or_an_id_with_a_revision():
    cfg = load_config(
        {
            "sft": {"from": "Gen-Verse/Qwen3-4B-RA-SFT"},
            "eval": {
                "checkpoints": {"step30": "ckpt/step_30", "demy": {"id": "Gen-Verse/DemyAgent-4B", "revision": "v1"}}
            },
        }
    )
    assert cfg.sft.from_ == ModelSourceConfig(id="Gen-Verse/Qwen3-4B-RA-SFT", revision=None)
    assert cfg.eval.checkpoints["step30"] == ModelSourceConfig(id="ckpt/step_30", revision=None)
    assert cfg.eval.checkpoints["demy"] == ModelSourceConfig(id="Gen-Verse/DemyAgent-4B", revision="v1")
    assert load_config({}).sft.from_ is None, "the default trains SFT"
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['rev'\] under 'sft.from'"):
        load_config({"sft": {"from": {"id": "Gen-Verse/Qwen3-4B-RA-SFT", "rev": "v1"}}})


def test_a_local_folder_is_linked_stamped_and_recorded(tiny_model, tmp_path):
    out = tmp_path / "models" / "sft"
    done = fetch_model("--key", "sft.from", "--id", str(tiny_model), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert (out / "model.safetensors").is_symlink() and (out / "model.safetensors").resolve().parent == tiny_model
    config = json.loads((out / "config.json").read_text())
    assert config[MODEL_DIGEST_KEY] == model_digest(tiny_model)
    assert config[MODEL_SOURCE_KEY] == {"id": str(tiny_model), "revision": None, "commit": None}
    assert MODEL_SOURCE_KEY not in json.loads((tiny_model / "config.json").read_text()), "the source is not written to"
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 2


def test_a_revision_for_a_local_folder_is_refused(tiny_model, tmp_path):
    done = fetch_model("--key", "sft.from", "--id", str(tiny_model), "--revision", "v1", "--out", str(tmp_path / "o"))
    assert done.returncode != 0
    assert "sft.from=" in done.stderr and "pins a hub id only" in done.stderr
    done = fetch_model(
        "--key", "sft.from", "--id", str(tmp_path / "no" / "such" / "folder"), "--out", str(tmp_path / "o")
    )
    assert done.returncode == 2 and "sft.from=" in done.stderr and "probably a typo" in done.stderr


@pytest.fixture
def hub_cache(tiny_model, tmp_path) -> Path:
    """A Hugging Face cache holding Gen-Verse/DemyAgent-4B at COMMIT, which refs/main points to."""
    repo = tmp_path / "hub" / "models--Gen-Verse--DemyAgent-4B"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for entry in tiny_model.iterdir():
        (snapshot / entry.name).write_bytes(entry.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return tmp_path / "hub"


@pytest.mark.parametrize("revision", ["main", COMMIT])
def test_a_hub_id_comes_from_the_cache_at_its_revision(hub_cache, tmp_path, revision):
    offline = {"HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "demy"
    done = fetch_model("--id", "Gen-Verse/DemyAgent-4B", "--revision", revision, "--out", str(out), env=offline)
    assert done.returncode == 0, done.stderr
    source = json.loads((out / "config.json").read_text())[MODEL_SOURCE_KEY]
    assert source == {"id": "Gen-Verse/DemyAgent-4B", "revision": revision, "commit": COMMIT}
    assert (out / "model.safetensors").resolve().parent.name == COMMIT


def test_a_revision_missing_from_the_cache_is_not_replaced_by_another(hub_cache, tmp_path):
    offline = {"HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}
    done = fetch_model(
        "--id", "Gen-Verse/DemyAgent-4B", "--revision", "f" * 40, "--out", str(tmp_path / "o"), env=offline
    )
    assert done.returncode == 2 and f"at revision '{'f' * 40}': not in the local hub cache" in done.stderr, done.stderr
    assert not (tmp_path / "o").exists()
