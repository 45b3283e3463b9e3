"""SFT and GRPO with LoRA (``sft.lora``, ``grpo.lora``) through the stage CLIs on a tiny Qwen3, in
the loop and step full fine-tuning runs: only the adapted layers change, the final model is a
merged Hugging Face folder with its adapter beside it, checkpoints hold the adapter and its
optimizer but not the frozen weights, GRPO's KL reference is the adapter switched off, and a run
stopped after a checkpoint resumes to the uninterrupted run's metrics and weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers.grpo_runs import TINY_RUN, grpo_command, metric_records, write_arith_inputs
from helpers.sft_runs import BASE_SFT, sft_env, sft_run_args, sft_run_results, sft_workspace, train_sft_run
from safetensors.torch import load_file

from agentrl.training.preemption import EXIT_CODE

ADAPTED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _changed_only_where_adapted(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> None:
    assert sorted(after) == sorted(before), "the merged folder has the model's own tensor names"
    for name, tensor in before.items():
        if name.endswith(tuple(f"{m}.weight" for m in ADAPTED)):
            assert not torch.equal(after[name], tensor), f"{name}: its adapter did not train"
        else:
            assert torch.equal(after[name], tensor), f"{name} is frozen under LoRA"


def _check_only_the_adapters_are_saved(step_folder: Path) -> None:
    """DeepSpeed's module state in a checkpoint: the adapters, not the frozen weights. DeepSpeed drops
    frozen parameters by their first name, so a tied output head (an alias of the frozen embedding,
    Qwen3's small models) stays: one vocabulary matrix, which the resume loads back onto itself."""
    states = torch.load(step_folder / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    keys = list(states["module"])
    assert any(".lora_A." in k for k in keys) and any(".lora_B." in k for k in keys), keys
    frozen = [k for k in keys if ".lora_A." not in k and ".lora_B." not in k]
    assert len(frozen) == 1 and frozen[0].endswith("lm_head.weight"), frozen


def _latest_step(checkpoints: Path) -> int:
    pointer = checkpoints / "latest"
    return int(pointer.read_text().removeprefix("step_")) if pointer.exists() else 0


def _stop_after(process: subprocess.Popen, checkpoints: Path, step: int, signum: int) -> None:
    deadline = time.monotonic() + 600
    while _latest_step(checkpoints) < step:
        assert process.poll() is None, "the run ended before it could be stopped"
        assert time.monotonic() < deadline, f"no checkpoint of step {step} within 10 minutes"
        time.sleep(0.02)
    os.killpg(process.pid, signum) if signum == signal.SIGKILL else process.send_signal(signum)


SFT_LORA = {**BASE_SFT, "epochs": 2, "lr": 3e-2, "save_every_steps": 3, "lora": {"enabled": True, "rank": 4}}


@pytest.fixture(scope="module")
def sft_lora_run(tmp_path_factory):
    """The tiny SFT workspace and its uninterrupted LoRA run (one process, ZeRO-0)."""
    root = sft_workspace(tmp_path_factory.mktemp("sft-lora"))
    return root, *train_sft_run(root, "straight", SFT_LORA)


@pytest.mark.timeout(1800)
@pytest.mark.slow
def test_sft_with_lora_learns_in_the_adapters_exports_merged_and_resumes_to_the_same_model(sft_lora_run):
    root, reference, weights = sft_lora_run
    losses = [m["loss"] for m in reference]
    assert len(losses) == 12 and losses[-1] < 0.98 * losses[0], losses
    _changed_only_where_adapted(load_file(root / "base" / "model.safetensors"), weights)
    adapter = root / "straight" / "model" / "adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4
    assert (adapter / "adapter_model.safetensors").exists()
    _check_only_the_adapters_are_saved(root / "straight" / "ckpt" / "step_9")

    process = subprocess.Popen(
        sft_run_args(root, "stopped", SFT_LORA, 1), env=sft_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _stop_after(process, root / "stopped" / "ckpt", 3, signal.SIGUSR1)
    process.communicate(timeout=600)
    assert process.returncode == EXIT_CODE
    done = subprocess.run(
        sft_run_args(root, "stopped", SFT_LORA, 1), env=sft_env(), capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0 and "resumed from" in done.stderr, done.stderr[-3000:]
    resumed, resumed_weights = sft_run_results(root / "stopped")
    assert [m["step"] for m in resumed] == list(range(1, 13)), "no step repeated or skipped"
    assert [m["loss"] for m in resumed] == pytest.approx(losses, rel=1e-6, abs=1e-7)
    for name, tensor in weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.timeout(1800)
@pytest.mark.slow
def test_sft_with_lora_on_two_zero2_processes_packed_trains_as_one_process(sft_lora_run):
    """ZeRO-2 partitions the adapters' optimizer state alone (the frozen weights have none) and
    reduces only their gradients; packed rows reach the attention inside PEFT's wrapper."""
    root, single, single_weights = sft_lora_run
    double, weights = train_sft_run(root, "two", {**SFT_LORA, "packing": True, "deepspeed": {"zero_stage": 2}}, 2)
    torch.testing.assert_close(
        torch.tensor([m["loss"] for m in double]), torch.tensor([m["loss"] for m in single]), rtol=1e-4, atol=1e-5
    )
    for name, tensor in single_weights.items():  # Adam's normalised steps at lr 3e-2, scaled by alpha / r = 8,
        # carry the summation order's round-off (measured: 8e-4 at most, on weights of ~0.6)
        torch.testing.assert_close(weights[name], tensor, rtol=1e-3, atol=2e-3, msg=name)


SFT_LORA_EMBEDDING = {**SFT_LORA, "lora": {**SFT_LORA["lora"], "modules_to_save": ["embed_tokens"]}}


@pytest.mark.timeout(1800)
@pytest.mark.slow
def test_sft_with_lora_and_a_trained_embedding_exports_it_tied_checkpoints_it_and_resumes_to_the_same_model(tmp_path):
    """``sft.lora.modules_to_save: [embed_tokens]`` (presets/lora.yaml): the embedding, which is the
    tied output head, trains beside the adapters; the merged folder holds the trained copy under the
    model's own name, the checkpoint holds the copy but not the frozen original, and a run stopped
    after a checkpoint resumes to the uninterrupted run's weights."""
    root = sft_workspace(tmp_path)
    straight, weights = train_sft_run(root, "straight", SFT_LORA_EMBEDDING)
    base = load_file(root / "base" / "model.safetensors")
    assert "lm_head.weight" not in weights, "the tied head is written once, as the embedding"
    assert not torch.equal(weights["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    for name, tensor in base.items():
        if name != "model.embed_tokens.weight" and not name.endswith(tuple(f"{m}.weight" for m in ADAPTED)):
            assert torch.equal(weights[name], tensor), f"{name} is frozen under LoRA"
    states = torch.load(root / "straight" / "ckpt" / "step_9" / "mp_rank_00_model_states.pt", weights_only=False)
    whole = [k for k in states["module"] if ".lora_A." not in k and ".lora_B." not in k]
    assert any(k.endswith("model.embed_tokens.modules_to_save.default.weight") for k in whole), whole
    # the frozen original is the model folder's; only the tied head's aliases of both stay (as
    # _check_only_the_adapters_are_saved says of the head)
    assert [k for k in whole if ".embed_tokens." in k and ".modules_to_save." not in k] == [], whole
    assert all(".embed_tokens." in k or ".lm_head." in k for k in whole), whole

    process = subprocess.Popen(
        sft_run_args(root, "stopped", SFT_LORA_EMBEDDING, 1),
        env=sft_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, killed whole as a job's is
    )
    _stop_after(process, root / "stopped" / "ckpt", 3, signal.SIGKILL)
    process.communicate(timeout=600)
    done = subprocess.run(
        sft_run_args(root, "stopped", SFT_LORA_EMBEDDING, 1), env=sft_env(), capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0 and "resumed from" in done.stderr, done.stderr[-3000:]
    resumed, resumed_weights = sft_run_results(root / "stopped")
    assert [m["loss"] for m in resumed[-3:]] == pytest.approx([m["loss"] for m in straight[-3:]], rel=1e-6, abs=1e-7)
    for name, tensor in weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, rtol=1e-6, atol=1e-7, msg=name)


# grpo_t: the KL-to-reference variant (kl_coef 0.001), so the reference forward runs with the adapter
# off; the entropy bonus gives the adapters a gradient whatever the tiny policy's rewards are; one
# optimizer step per GRPO step, so step 1's update runs at the initial policy (KL 0).
GRPO_LORA = {
    **TINY_RUN,
    "grpo": {
        **TINY_RUN["grpo"],
        "mini_batch_prompts": 2,
        "variant": "grpo_t",
        "algorithm": {"entropy_coef": 0.05},
        "lr": 2e-2,
        "lora": {"enabled": True, "rank": 2},
    },
}


def _grpo_lora_command(model: Path, root: Path, run: Path) -> list[str]:
    command = grpo_command(model, root, run)
    command[command.index("--config-json") + 1] = json.dumps(GRPO_LORA)
    return command


@pytest.mark.timeout(2400)
@pytest.mark.slow
def test_grpo_with_lora_trains_the_adapters_against_the_adapter_off_reference_and_resumes_exactly(tmp_path):
    from helpers.rollout import random_policy

    model, root = random_policy(), write_arith_inputs(tmp_path / "inputs")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    straight = tmp_path / "straight"
    done = subprocess.run(
        _grpo_lora_command(model, root, straight), env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = metric_records(straight / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    # step 1 starts at the model (B = 0): the actor is its reference; the trained adapters move it away
    assert records[1]["actor/kl_ref"] == pytest.approx(0.0, abs=1e-7)
    assert records[3]["actor/kl_ref"] > 0 and records[4]["actor/kl_ref"] > 0
    _changed_only_where_adapted(
        load_file(model / "model.safetensors"), load_file(straight / "rl" / "model.safetensors")
    )
    assert (straight / "rl" / "adapter" / "adapter_model.safetensors").exists()
    _check_only_the_adapters_are_saved(straight / "checkpoints" / "step_4")
    assert (straight / "checkpoints" / "step_4" / "adapter" / "adapter_config.json").exists()

    killed = tmp_path / "killed"
    process = subprocess.Popen(
        _grpo_lora_command(model, root, killed),
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _stop_after(process, killed / "checkpoints", 2, signal.SIGKILL)
    process.wait()
    done = subprocess.run(_grpo_lora_command(model, root, killed), env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "resumed from" in done.stderr, done.stderr[-3000:]
    resumed = metric_records(killed / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
    for ra, rb in zip(records, resumed):
        for key in ra:
            if key.startswith(("rollout/", "actor/", "val/")) and not key.endswith("_s"):
                assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-7), (ra["step"], key)
    wa, wb = load_file(straight / "rl" / "model.safetensors"), load_file(killed / "rl" / "model.safetensors")
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.timeout(1800)
@pytest.mark.slow
def test_grpo_with_lora_in_the_separate_placement_samples_with_each_merged_version(tmp_path):
    """grpo.placement: separate, the hf engine in a rollout process of its own with the model
    folder's plain weights: each version reaches it merged (MergedWeightSource over the gloo
    backend), so the actor's log-probs of the sampled tokens equal the sampling ones at every
    step, the adapters trained in between."""
    from helpers.grpo_runs import grpo_paths
    from helpers.rollout import random_policy

    from agentrl.config import load_config
    from agentrl.grpo.trainer import train

    model, root = random_policy(), write_arith_inputs(tmp_path / "inputs")
    overlay = {"placement": "separate", "max_steps": 3, "test_freq": 0, "val_before_train": False}
    cfg = load_config({**GRPO_LORA, "grpo": {**GRPO_LORA["grpo"], **overlay}})
    paths = grpo_paths(model, root, tmp_path / "run")
    assert train(cfg, paths) == 3
    records = metric_records(paths.metrics)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[2]["actor/kl_ref"] > 0, "the adapters moved the policy before step 3"
    for record in records:
        assert record["rollout/logp_mismatch_abs"] < 1e-4, record
    _changed_only_where_adapted(load_file(model / "model.safetensors"), load_file(paths.out / "model.safetensors"))
