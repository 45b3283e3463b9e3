"""``python -m agentrl sft`` end to end on CPU: 1 vs 2 processes (gloo), ZeRO-2/3, resume after a kill.

Each run is a real subprocess of the stage CLI on a tiny Qwen3 and real tool-use conversations
(arithmetic whose tool outputs are computed). These take tens of seconds each: marked slow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers.sft_runs import (
    BASE_SFT,
    sft_conversation,
    sft_env,
    sft_run_args,
    sft_run_results,
    train_sft_run,
)
from safetensors.torch import load_file

from agentrl.data.prompts import CODE_INTERPRETER_TOOL

pytestmark = pytest.mark.slow


def test_two_processes_zero2_and_zero3_padded_or_packed_follow_the_single_process_loss_curve(tiny_sft_workspace):
    single, single_weights = train_sft_run(tiny_sft_workspace, "one", {**BASE_SFT, "deepspeed": {"zero_stage": 2}})
    assert [m["step"] for m in single] == list(range(1, 13))
    assert single[-1]["loss"] < 0.8 * single[0]["loss"], "the model must learn"
    base = load_file(tiny_sft_workspace / "base" / "model.safetensors")
    assert any(not torch.equal(base[k], single_weights[k]) for k in base)
    for stage, packing in ((2, False), (3, False), (3, True)):  # packing: sft.packing's rows (the paper preset's)
        double, weights = train_sft_run(
            tiny_sft_workspace,
            f"two-zero{stage}{'-packed' * packing}",
            {**BASE_SFT, "packing": packing, "deepspeed": {"zero_stage": stage}},
            2,
        )
        losses = torch.tensor([m["loss"] for m in double])
        torch.testing.assert_close(losses, torch.tensor([m["loss"] for m in single]), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(
            torch.tensor([m["grad_norm"] for m in double]),
            torch.tensor([m["grad_norm"] for m in single]),
            rtol=1e-3,
            atol=1e-5,
        )
        assert weights.keys() == single_weights.keys()
        for key in weights:
            torch.testing.assert_close(weights[key], single_weights[key], rtol=1e-3, atol=1e-4)


def test_the_output_is_a_hugging_face_folder_the_rollout_engines_load(tiny_sft_workspace):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    train_sft_run(tiny_sft_workspace, "hf", {**BASE_SFT, "epochs": 1})
    folder = tiny_sft_workspace / "hf" / "model"
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in folder.iterdir()
    }
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    prompt = tokenizer.apply_chat_template(
        sft_conversation(0).messages[:1],
        tools=[CODE_INTERPRETER_TOOL],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 5 or int(out[0, -1]) in (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )


def _wait_for_step(metrics: Path, step: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be killed"
        if metrics.exists():
            lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
            if lines and lines[-1]["step"] >= step:
                return
        time.sleep(0.01)
    raise TimeoutError(f"step {step} never appeared in {metrics}")


@pytest.mark.long  # CI: test_reruns' killed sft job resumes under Snakemake
def test_a_killed_run_resumes_from_its_last_checkpoint_and_ends_with_the_same_model(tiny_sft_workspace):
    sft = {**BASE_SFT, "epochs": 4, "save_every_steps": 4, "keep_checkpoints": 2}
    reference, reference_weights = train_sft_run(tiny_sft_workspace, "uninterrupted", sft)
    assert len(reference) == 24

    run = tiny_sft_workspace / "killed"
    proc = subprocess.Popen(
        sft_run_args(tiny_sft_workspace, "killed", sft, 1),
        env=sft_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_step(run / "metrics.jsonl", 10, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (run / "model").exists(), "killed before the end"
    last_logged = max(json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines())
    latest = int((run / "ckpt" / "latest").read_text().removeprefix("step_"))
    assert latest % 4 == 0 and 8 <= latest <= last_logged < 24
    kept = sorted(int(p.name.removeprefix("step_")) for p in (run / "ckpt").glob("step_*"))
    assert kept == [latest - 4, latest], "keep_checkpoints: 2"

    (run / "metrics.jsonl").unlink()  # as Snakemake removes a failed job's outputs: the checkpoint has them
    done = subprocess.run(
        sft_run_args(tiny_sft_workspace, "killed", sft, 1), env=sft_env(), capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"after step {latest}" in done.stderr, done.stderr[-2000:]
    resumed, resumed_weights = sft_run_results(run)
    assert [m["step"] for m in resumed] == list(range(1, 25)), "no step repeated or missing"
    torch.testing.assert_close(
        torch.tensor([m["loss"] for m in resumed]), torch.tensor([m["loss"] for m in reference]), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(torch.tensor([m["lr"] for m in resumed]), torch.tensor([m["lr"] for m in reference]))
    for key in reference_weights:
        torch.testing.assert_close(resumed_weights[key], reference_weights[key], rtol=1e-5, atol=1e-6)


def test_checkpoints_of_another_setup_are_set_aside_and_the_new_setup_trains_from_step_0(tiny_sft_workspace):
    sft = {**BASE_SFT, "epochs": 1, "save_every_steps": 2}
    train_sft_run(tiny_sft_workspace, "setup", sft)
    checkpoints = tiny_sft_workspace / "setup" / "ckpt"
    kept = sorted(
        p.relative_to(checkpoints) for p in checkpoints.rglob("*") if p.is_file() and p.name != "trainer.lock"
    )
    latest = (checkpoints / "latest").read_text().strip()
    args = sft_run_args(tiny_sft_workspace, "setup", {**sft, "lr": 1e-3}, 1)
    done = subprocess.run(args, env=sft_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "resumed from" not in done.stderr, done.stderr[-4000:]
    # the log names what changed and where the old run is kept; the old files are all there
    aside = checkpoints.with_name(f"ckpt.{latest}")
    assert "differs in sft.lr" in done.stderr and f"it is kept in {aside}" in done.stderr, done.stderr[-2000:]
    assert sorted(p.relative_to(aside) for p in aside.rglob("*") if p.is_file()) == kept
    metrics, _ = sft_run_results(tiny_sft_workspace / "setup")
    assert [m["step"] for m in metrics] == list(range(1, 7))
