"""The toolkit the SFT and GRPO stages share (``agentrl.training``): metrics file, run fingerprint,
seeds, the end of a training process."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

from agentrl.training.deepspeed_engine import close_distributed
from agentrl.training.fingerprint import file_sha256, fingerprint_of, model_files, without_keys
from agentrl.training.seeds import derived_seed


def test_metrics_file_is_rewritten_on_reset_and_appended_per_step(tmp_path):
    from agentrl.training.metrics import MetricsWriter, read_metrics

    path = tmp_path / "rl" / "metrics.jsonl"
    writer = MetricsWriter(path)
    for step in range(3):
        writer.write({"step": step, "rollout/reward_mean": 0.1 * step})
    writer.reset(read_metrics(path)[:2])  # a resume from the checkpoint of step 1
    writer.write({"step": 2, "rollout/reward_mean": 0.5})
    assert [(r["step"], r["rollout/reward_mean"]) for r in read_metrics(path)] == [(0, 0.0), (1, 0.1), (2, 0.5)]
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(ValueError, match="line 4"):
        read_metrics(path)


def test_metrics_writer_hands_each_record_to_the_tracker(tmp_path):
    pytest.importorskip("tensorboard")
    from agentrl.config import load_config
    from agentrl.tracking import Tracker
    from agentrl.training.metrics import MetricsWriter

    tracker = Tracker(load_config({"tracking": {"tensorboard": True}}).tracking, tmp_path, "grpo", fresh=True)
    writer = MetricsWriter(tmp_path / "metrics.jsonl", tracker=tracker)
    writer.write({"step": 1, "actor/lr": 1e-3})
    writer.close()
    assert any((tmp_path / "tracking" / "tensorboard").iterdir())


def test_file_sha256_streams_the_same_digest_as_reading_the_whole_file(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(3 * (1 << 20) + 17))  # crosses block boundaries
    assert file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_run_fingerprint_follows_content_settings_and_model_files_not_left_out_keys(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    data = tmp_path / "data.parquet"
    data.write_bytes(b"rows")
    left_out = {"sft": ("save_every_steps",), "rollout.vllm": ("max_num_seqs",)}

    def fingerprint(sft: dict) -> dict:
        settings = without_keys({"sft": sft, "rollout": {"vllm": {"max_num_seqs": 4, "x": 1}}}, left_out)
        return fingerprint_of(
            settings, seed=1, world_size=1, model_dir=model, files={"data": data, "eval": {"a": data}}
        )

    base = fingerprint({"lr": 1e-5, "betas": (0.9, 0.95), "save_every_steps": 10})
    assert base["sft"] == {"lr": 1e-5, "betas": [0.9, 0.95]}  # JSON values, as a checkpoint reads back
    assert base["rollout"] == {"vllm": {"x": 1}}
    assert base["data_sha256"] == base["eval_sha256"]["a"] == file_sha256(data)
    assert base["model_files"] == model_files(model) and list(base["model_files"]) == ["model.safetensors"]
    assert fingerprint({"lr": 1e-5, "betas": (0.9, 0.95), "save_every_steps": 99}) == base
    assert fingerprint({"lr": 2e-5, "betas": (0.9, 0.95), "save_every_steps": 10}) != base
    data.write_bytes(b"other rows")
    assert fingerprint({"lr": 1e-5, "betas": (0.9, 0.95), "save_every_steps": 10})["data_sha256"] != base["data_sha256"]


def test_derived_seeds_are_stable_and_separate_streams():
    assert derived_seed(3, "grpo-data") == derived_seed(3, "grpo-data", 0)
    assert (
        len({derived_seed(3, "a", 0), derived_seed(3, "a", 1), derived_seed(3, "b", 0), derived_seed(4, "a", 0)}) == 4
    )
    assert 0 <= derived_seed(3, "a") < 2**31


_LAUNCHER_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def own_process_group(monkeypatch):
    """A one-process group that the test's trainer opens; whatever it leaves is torn down after."""
    import torch.distributed as dist

    for key in _LAUNCHER_KEYS:
        monkeypatch.setenv(key, "unset")
        monkeypatch.delenv(key)  # recorded as absent, so the keys init_distributed sets go again
    yield dist
    close_distributed()


def test_a_finished_or_stopped_trainer_destroys_its_process_group_and_a_failed_one_leaves_it(own_process_group):
    """Gloo's threads left to interpreter teardown abort a finished two-rank stage now and then
    (SIGABRT after "SFT done", seen in CI), so run_trainer destroys the group after a run that
    ended alike on every rank, and leaves it after an error, where destroying can hang."""
    import logging

    from agentrl.config import ConfigError
    from agentrl.training import deepspeed_engine as dse
    from agentrl.training.cli import run_trainer
    from agentrl.training.preemption import EXIT_CODE, StoppedForRetry

    dist, log = own_process_group, logging.getLogger("test")

    def finishes():
        dse.init_distributed()
        assert dist.is_initialized()

    def stops():
        dse.init_distributed()
        raise StoppedForRetry("sft", 3, "ckpt", "SIGTERM")

    def refuses():
        dse.init_distributed()
        raise ConfigError("sft.global_batch_size: 3 does not split over 2 processes")

    assert run_trainer(finishes, log) == 0
    assert not dist.is_initialized()
    assert run_trainer(stops, log) == EXIT_CODE
    assert not dist.is_initialized()
    assert run_trainer(refuses, log) == 2
    assert dist.is_initialized()


def test_a_model_folder_left_without_its_config_is_removed_at_the_start_and_nothing_else_is(tmp_path):
    """Snakemake removes ``config.json`` (the rule's output) before a training job; a job that then
    fails would leave the old weights behind it. The stage removes such remains, and only them."""
    from agentrl.training.deepspeed_engine import DistributedContext, discard_incomplete_model

    main = DistributedContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    remains = tmp_path / "rl"
    (remains / "adapter").mkdir(parents=True)
    for name in ("model.safetensors", "generation_config.json", "tokenizer.json", "chat_template.jinja"):
        (remains / name).write_text("x")
    discard_incomplete_model(remains, main)
    assert not remains.exists()

    complete, other = tmp_path / "sft", tmp_path / "results"
    for folder, names in ((complete, ("config.json", "model.safetensors")), (other, ("model.safetensors", "notes.md"))):
        folder.mkdir()
        for name in names:
            (folder / name).write_text("x")
        discard_incomplete_model(folder, main)
        assert sorted(p.name for p in folder.iterdir()) == sorted(names), folder
