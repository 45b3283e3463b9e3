"""The GRPO stage end to end on a tiny model: outputs, metrics, checkpoints, and a run killed
mid-training that resumes without repeating or skipping a step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentrl.config import load_config
from agentrl.data.records import Problem, write_records

TINY_RUN = {
    "rollout": {"max_response_tokens": 24, "max_turns": 2, "batch_size": 16},
    "reward": {"overlong": {"max_response_length": 24, "buffer_length": 8}},
    "sandbox": {"workers": 2},
    "grpo": {"batch_prompts": 2, "n": 2, "mini_batch_prompts": 1, "max_steps": 4, "save_freq": 1,
             "keep_checkpoints": 2, "test_freq": 2, "micro_batch_tokens": 64, "lr": 1e-3,
             "validation": {"n": 1}},
}


def _arith(count: int, split: str) -> list[Problem]:
    return [
        Problem(f"{split}-{i}", "embedded-arith",
                [{"role": "user", "content": f"Compute {i} + {i + 3}. Use the code tool, then give the answer in \\boxed{{}}."}],
                "math", str(2 * i + 3))
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from rollout_fixtures import random_policy

    root = tmp_path_factory.mktemp("grpo-inputs")
    write_records(_arith(9, "rl"), root / "rl_train.parquet")
    write_records(_arith(3, "eval"), root / "arith.parquet")
    return random_policy(), root


def _paths(model: Path, root: Path, run: Path):
    from agentrl.grpo.runner import GrpoPaths
    from agentrl.training.deepspeed_engine import find_deepspeed_config

    return GrpoPaths(model, root / "rl_train.parquet", (root / "arith.parquet",), run / "rl", run / "metrics.jsonl",
                     run / "checkpoints", find_deepspeed_config(0))


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_grpo_stage_writes_model_metrics_and_checkpoints_and_a_rerun_resumes(inputs, tmp_path):
    from agentrl.grpo.runner import train

    model, root = inputs
    cfg = load_config({**TINY_RUN, "grpo": {**TINY_RUN["grpo"], "max_steps": 2}})
    paths = _paths(model, root, tmp_path)
    assert train(cfg, paths) == 2
    records = _records(paths.metrics)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert "val/arith/avg@1" in records[0] and "val/mean/avg@1" in records[2]
    for key in ("rollout/reward_mean", "rollout/acc_mean", "rollout/advantage_std", "actor/entropy",
                "actor/clip_frac_low", "actor/clip_frac_high", "actor/approx_kl_k3", "actor/grad_norm",
                "actor/lr", "rollout/response_length_max", "rollout/response_clip_share",
                "rollout/overlong_penalty_mean", "rollout/tool_calls_mean", "rollout/tool_success_rate",
                "rollout/turns_mean", "rollout/logp_mismatch_abs", "timing/rollout_s", "timing/reward_s",
                "timing/update_s"):
        assert key in records[1], key
    assert records[1]["rollout/trajectories"] == 4 and records[1]["actor/optimizer_steps"] == 2
    # Sampling and recomputed log-probs agree: same weights, same temperature, same tokens.
    assert records[1]["rollout/logp_mismatch_abs"] < 1e-4
    # The final policy is a Hugging Face folder that differs from the initial one.
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (paths.out / name).exists(), name
    before, after = _weights(model), _weights(paths.out)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert sorted(p.name for p in paths.checkpoints.glob("step_*")) == ["step_1", "step_2"]
    assert (paths.checkpoints / "step_2" / "config.json").exists()  # checkpoints are HF folders too
    # A rerun finds the last checkpoint and has nothing left to train; the metrics stay as they were.
    assert train(cfg, paths) == 0
    assert _records(paths.metrics) == records


def _command(model: Path, root: Path, run: Path) -> list[str]:
    return [sys.executable, "-m", "agentrl", "grpo", "--config-json", json.dumps(TINY_RUN),
            "--model", str(model), "--train", str(root / "rl_train.parquet"), "--eval", str(root / "arith.parquet"),
            "--out", str(run / "rl"), "--metrics", str(run / "metrics.jsonl"),
            "--checkpoint-dir", str(run / "checkpoints"), "--nproc", "0", "--threads", "1"]


def _latest_step(checkpoints: Path) -> int:
    pointer = checkpoints / "latest"
    return int(pointer.read_text().removeprefix("step_")) if pointer.exists() else 0


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_last_checkpoint_without_repeating_or_skipping_steps(inputs, tmp_path):
    model, root = inputs
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    straight = tmp_path / "straight"
    subprocess.run(_command(model, root, straight), check=True, env=env, capture_output=True, timeout=600)

    killed = tmp_path / "killed"
    process = subprocess.Popen(_command(model, root, killed), env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while _latest_step(killed / "checkpoints") < 2:  # kill it while step 3 is under way
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint of step 2 within 10 minutes"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (killed / "rl" / "config.json").exists()
    subprocess.run(_command(model, root, killed), check=True, env=env, capture_output=True, timeout=600)

    a, b = _records(straight / "metrics.jsonl"), _records(killed / "metrics.jsonl")
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4]
    for ra, rb in zip(a, b):  # the same prompts, rollouts, rewards and updates, step for step
        for key in ra:
            if key.startswith(("rollout/", "actor/", "val/")) and not key.endswith("_s"):
                assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-7), (ra["step"], key)
    wa, wb = _weights(straight / "rl"), _weights(killed / "rl")
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-5, atol=1e-6, msg=name)
