"""The GRPO stage end to end on a tiny model: outputs, metrics, checkpoints, a run killed
mid-training that resumes without repeating or skipping a step, and a checkpoint of another run
setup (config, inputs, process count) that is refused and kept rather than resumed or deleted."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers.grpo_runs import TINY_RUN, arith_split, grpo_command, grpo_paths, metric_records, write_arith_inputs

from agentrl.config import load_config
from agentrl.data.records import write_records


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from helpers.rollout import random_policy

    return random_policy(), write_arith_inputs(tmp_path_factory.mktemp("grpo-inputs"))


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.mark.timeout(1800)  # several training runs: over the global 600 s on a loaded 2-core machine
def test_grpo_stage_writes_model_metrics_and_checkpoints_and_a_rerun_resumes(inputs, tmp_path):
    from agentrl.grpo.trainer import train

    model, root = inputs
    cfg = load_config({**TINY_RUN, "grpo": {**TINY_RUN["grpo"], "max_steps": 2}})
    paths = grpo_paths(model, root, tmp_path)
    assert train(cfg, paths) == 2
    records = metric_records(paths.metrics)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert "val/arith/avg@1" in records[0] and "val/mean/avg@1" in records[2]
    for key in (
        "rollout/reward_mean",
        "rollout/acc_mean",
        "rollout/advantage_std",
        "actor/entropy",
        "actor/clip_frac_low",
        "actor/clip_frac_high",
        "actor/approx_kl_k3",
        "actor/grad_norm",
        "actor/lr",
        "rollout/response_length_max",
        "rollout/response_clip_share",
        "rollout/overlong_penalty_mean",
        "rollout/tool_calls_mean",
        "rollout/tool_success_rate",
        "rollout/turns_mean",
        "rollout/logp_mismatch_abs",
        "timing/rollout_s",
        "timing/reward_s",
        "timing/update_s",
    ):
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
    assert metric_records(paths.metrics) == records


def _overlay(section: str, **values) -> dict:
    return {**TINY_RUN, section: {**TINY_RUN.get(section, {}), **values}}


def test_the_run_fingerprint_changes_with_what_shapes_training_and_not_with_where_it_runs(inputs, tmp_path):
    from agentrl.grpo.trainer import run_fingerprint
    from agentrl.training.fingerprint import fingerprint_differences

    model, root = inputs
    model = Path(shutil.copytree(model, tmp_path / "model"))  # its mtimes change below
    shutil.copy(root / "rl_train.parquet", tmp_path / "rl_train.parquet")
    shutil.copy(root / "arith.parquet", tmp_path / "arith.parquet")
    paths = grpo_paths(model, tmp_path, tmp_path / "run")
    base = run_fingerprint(load_config(TINY_RUN), paths, world_size=1)
    assert run_fingerprint(load_config(TINY_RUN), paths, world_size=1) == base
    assert json.loads(json.dumps(base)) == base  # as a checkpoint's trainer_state.json gives it back

    def changed(overlay: dict, world_size: int = 1) -> list[str]:
        return fingerprint_differences(base, run_fingerprint(load_config(overlay), paths, world_size))

    assert changed(_overlay("grpo", lr=2e-3)) == ["grpo.lr"]
    assert changed({**TINY_RUN, "seed": 7}) == ["seed"]
    assert changed(TINY_RUN, world_size=2) == ["world_size"]
    assert changed(_overlay("rollout", temperature=0.7)) == ["rollout.temperature"]
    assert changed(_overlay("reward", math_mode="math_verify")) == ["reward.math_mode"]
    assert changed(_overlay("tool", max_output_chars=100)) == ["tool.max_output_chars"]
    assert changed(_overlay("sandbox", timeout_s=1.5)) == ["sandbox.timeout_s"]
    assert changed(_overlay("grpo", validation={"n": 2})) == ["grpo.validation.n"]
    # Where and how fast it runs, and how checkpoints are kept, leave the run as it is.
    assert changed(_overlay("grpo", save_freq=3, keep_checkpoints=1)) == []
    assert changed(_overlay("sandbox", workers=1)) == []
    assert changed(_overlay("rollout", vllm={"gpu_memory_utilization": 0.5, "max_num_seqs": 8})) == []
    # Retrained upstream: a rewritten model file (same size) or other RL data.
    weights = model / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1))
    write_records(arith_split(8, "rl"), tmp_path / "rl_train.parquet")
    assert changed(TINY_RUN) == ["model_files.model.safetensors", "train_sha256"]


def test_fingerprint_differences_name_the_keys_that_differ():
    from agentrl.training.fingerprint import fingerprint_differences

    saved = {"grpo": {"lr": 1e-3, "n": 2, "betas": [0.9, 0.99]}, "seed": 1, "model_files": {"a": [1, 2]}}
    assert fingerprint_differences(saved, saved) == []
    assert fingerprint_differences(saved, {**saved, "grpo": {"lr": 1e-3, "n": 2, "betas": [0.9, 0.999]}}) == [
        "grpo.betas"
    ]
    assert fingerprint_differences(saved, {**saved, "seed": 2, "model_files": {"a": [1, 2], "b": [3, 4]}}) == [
        "model_files.b",
        "seed",
    ]


@pytest.mark.timeout(1800)  # several training runs: over the global 600 s on a loaded 2-core machine
def test_a_checkpoint_of_the_same_setup_is_resumed_and_one_of_another_setup_is_set_aside(inputs, tmp_path, caplog):
    """The rerun that Snakemake starts after ``grpo.lr`` changed does not resume the old run's
    checkpoint: it sets it aside, whole, beside the folder, says so, and trains from step 0."""
    from agentrl.grpo.trainer import train

    model, root = inputs
    run = {"max_steps": 2, "test_freq": 0, "val_before_train": False}
    first, second = load_config(_overlay("grpo", **run)), load_config(_overlay("grpo", **run, lr=2e-3))
    paths = grpo_paths(model, root, tmp_path)
    assert train(first, paths) == 2
    first_records = metric_records(paths.metrics)
    first_weights = _weights(paths.out)

    caplog.set_level(logging.INFO, logger="agentrl.grpo")
    assert train(first, paths) == 0, "the same setup resumes its final checkpoint"
    assert "resumed from" in caplog.text
    assert metric_records(paths.metrics) == first_records

    kept = sorted(
        p.relative_to(paths.checkpoints)
        for p in paths.checkpoints.rglob("*")
        if p.is_file() and p.name != "trainer.lock"
    )
    caplog.clear()
    assert train(second, paths) == 2, "another lr trains every step again"
    aside = paths.checkpoints.with_name(f"{paths.checkpoints.name}.step_2")
    assert "held the checkpoint of another run setup (step 2: its run setup differs in grpo.lr)" in caplog.text
    assert f"it is kept in {aside}" in caplog.text and "resumed from" not in caplog.text
    assert sorted(p.relative_to(aside) for p in aside.rglob("*") if p.is_file()) == kept
    records = metric_records(paths.metrics)
    assert [r["step"] for r in records] == [1, 2], "the old run's metric lines are gone"
    assert [r["actor/lr"] for r in records] == pytest.approx([2e-3, 2e-3])
    assert [r["actor/lr"] for r in first_records] == pytest.approx([1e-3, 1e-3])
    # The same prompts and rollouts on step 1 (same seed and initial model), another update.
    assert records[0]["rollout/reward_mean"] == first_records[0]["rollout/reward_mean"]
    assert any(not torch.equal(first_weights[k], w) for k, w in _weights(paths.out).items())
    state = json.loads((paths.checkpoints / "step_2" / "trainer_state.json").read_text())
    assert state["fingerprint"]["grpo"]["lr"] == 2e-3
    assert json.loads((aside / "step_2" / "trainer_state.json").read_text())["fingerprint"]["grpo"]["lr"] == 1e-3

    # back to the first lr: its run is now the one aside, and the second is set aside in turn
    caplog.clear()
    assert train(first, paths) == 2
    assert paths.checkpoints.with_name(f"{paths.checkpoints.name}.step_2.2").is_dir()


def _latest_step(checkpoints: Path) -> int:
    pointer = checkpoints / "latest"
    return int(pointer.read_text().removeprefix("step_")) if pointer.exists() else 0


@pytest.mark.timeout(1800)  # several training runs: over the global 600 s on a loaded 2-core machine
@pytest.mark.slow
def test_a_killed_run_resumes_from_its_last_checkpoint_without_repeating_or_skipping_steps(inputs, tmp_path):
    model, root = inputs
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    straight = tmp_path / "straight"
    subprocess.run(grpo_command(model, root, straight), check=True, env=env, capture_output=True, timeout=600)

    killed = tmp_path / "killed"
    process = subprocess.Popen(
        grpo_command(model, root, killed),
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 600
    while _latest_step(killed / "checkpoints") < 2:  # kill it while step 3 is under way
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint of step 2 within 10 minutes"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (killed / "rl" / "config.json").exists()
    subprocess.run(grpo_command(model, root, killed), check=True, env=env, capture_output=True, timeout=600)

    a, b = metric_records(straight / "metrics.jsonl"), metric_records(killed / "metrics.jsonl")
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4]
    for ra, rb in zip(a, b):  # the same prompts, rollouts, rewards and updates, step for step
        for key in ra:
            if key.startswith(("rollout/", "actor/", "val/")) and not key.endswith("_s"):
                assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-7), (ra["step"], key)
    wa, wb = _weights(straight / "rl"), _weights(killed / "rl")
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_two_processes_share_the_batch_through_the_queue_and_train_as_one_process_does(inputs, tmp_path):
    """Data parallelism on gloo: the ranks claim the step's prompts from the shared queue, uneven
    micro-batch counts are padded with empty ones (the collective gradient reduction never hangs),
    and since no rollout seed is a rank's, the run rolls out the same trajectories, gets the same
    rewards and trains the same weights (to float round-off) as one process."""
    model, root = inputs
    run = {
        **TINY_RUN,
        "grpo": {
            **TINY_RUN["grpo"],
            "batch_prompts": 4,
            "mini_batch_prompts": 2,
            "max_steps": 2,
            "micro_batch_tokens": 40,
        },
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    records = {}
    for nproc in ("0", "2"):
        command = grpo_command(model, root, tmp_path / nproc)
        command[command.index("--config-json") + 1] = json.dumps(run)
        command[command.index("--nproc") + 1] = nproc
        subprocess.run(command, check=True, env=env, capture_output=True, timeout=900)
        records[nproc] = metric_records(tmp_path / nproc / "metrics.jsonl")
    assert [r["step"] for r in records["2"]] == [0, 1, 2]
    assert all(r["rollout/trajectories"] == 8 and r["actor/optimizer_steps"] == 2 for r in records["2"][1:])
    assert (tmp_path / "2" / "checkpoints" / "step_2" / "rng_rank1.pt").exists()
    for one, two in zip(records["0"], records["2"]):
        for key in one:
            if key.startswith(("rollout/", "val/")) and not key.endswith("_s") and not _where_it_ran(key):
                assert two[key] == one[key], (one["step"], key)  # the same trajectories and rewards
            elif key.startswith("actor/") and key != "actor/approx_kl_k1":  # k1 is a round-off difference
                assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), (one["step"], key)
    before, one, two = _weights(model), _weights(tmp_path / "0" / "rl"), _weights(tmp_path / "2" / "rl")
    assert any(not torch.equal(before[k], two[k]) for k in before)
    for name in one:  # Adam's normalised steps (lr 1e-3) carry the summation order's round-off
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.slow
def test_two_processes_refuse_the_checkpoint_of_a_one_process_run(inputs, tmp_path):
    """Rank r's rollouts are seeded by r: a checkpoint written by one process is not resumed by two
    (a retry after `--set-resources grpo:gpu=2`). Rank 0 decides and tells rank 1; both stop, the
    checkpoint stays, and the message names the world size."""
    model, root = inputs
    run = {
        **TINY_RUN,
        "grpo": {
            **TINY_RUN["grpo"],
            "mini_batch_prompts": 2,
            "max_steps": 1,
            "test_freq": 0,
            "val_before_train": False,
        },
    }
    command = grpo_command(model, root, tmp_path)
    command[command.index("--config-json") + 1] = json.dumps(run)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, env=env, capture_output=True, timeout=600)
    assert not (tmp_path / "checkpoints" / "step_1" / "rng_rank1.pt").exists()

    command[command.index("--nproc") + 1] = "2"
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode != 0, done.stderr[-3000:]
    assert "kept and not resumed" in done.stderr and "world_size" in done.stderr, done.stderr[-3000:]
    state = json.loads((tmp_path / "checkpoints" / "step_1" / "trainer_state.json").read_text())
    assert state["fingerprint"]["world_size"] == 1


def _where_it_ran(key: str) -> bool:
    """Metrics of how the work fell over the ranks: the actor's round-off, the queue's claims."""
    return "logp_mismatch" in key or key == "rollout/groups_rank_max_share"


def _worker_of_rank(root: int, rank: int) -> int | None:
    """The pid of the torchrun worker of ``rank`` among the descendants of process ``root``
    (torchrun starts each worker in a session of its own)."""
    parents, environs = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                environs[int(entry.name)] = (entry / "environ").read_bytes().split(b"\0")
            except OSError:  # ended meanwhile, or not ours to read
                continue
    for pid, environ in environs.items():
        if f"RANK={rank}".encode() in environ and any(v.startswith(b"TORCHELASTIC_RUN_ID=") for v in environ):
            ancestor = parents.get(pid)
            while ancestor not in (None, 0, 1, root):
                ancestor = parents.get(ancestor)
            if ancestor == root:
                return pid
    return None


@pytest.mark.timeout(1800)
@pytest.mark.slow
def test_a_rank_killed_mid_queue_stops_the_run_in_seconds_and_the_rerun_resumes(inputs, tmp_path):
    """Rank 1 dies (SIGKILL) while step 3 rolls out: rank 0 drains the queue alone, its next
    collective fails on the closed connection and torchrun stops the job, in seconds rather than
    the collective timeout's hours; nothing of step 3 is written, and the same command resumes from
    the last checkpoint and ends as one uninterrupted process would (the same rollouts and rewards)."""
    model, root = inputs
    run = {**TINY_RUN, "grpo": {**TINY_RUN["grpo"], "batch_prompts": 4, "mini_batch_prompts": 2, "test_freq": 0}}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def command(folder: Path, nproc: str) -> list[str]:
        line = grpo_command(model, root, folder)
        line[line.index("--config-json") + 1] = json.dumps(run)
        line[line.index("--nproc") + 1] = nproc
        return line

    subprocess.run(command(tmp_path / "one", "0"), check=True, env=env, capture_output=True, timeout=600)
    killed = tmp_path / "killed"
    log = (tmp_path / "killed.log").open("w+")
    process = subprocess.Popen(command(killed, "2"), env=env, start_new_session=True, stdout=log, stderr=log)
    deadline = time.monotonic() + 600
    while _latest_step(killed / "checkpoints") < 2:  # step 3's rollout starts right after this checkpoint
        assert process.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint of step 2 within 10 minutes"
        time.sleep(0.02)
    victim = _worker_of_rank(process.pid, 1)
    assert victim is not None, "rank 1's worker not found"
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    process.wait(timeout=300)
    stderr = (tmp_path / "killed.log").read_text()
    assert process.returncode != 0
    assert time.monotonic() - killed_at < 120, "the run outlived its dead rank by minutes"
    assert "rank      : 1" in stderr and "SIGKILL" in stderr, stderr[-3000:]  # torchrun's failure report
    assert _latest_step(killed / "checkpoints") == 2 and not (killed / "checkpoints" / "step_3").exists()
    assert not (killed / "rl" / "config.json").exists()

    subprocess.run(command(killed, "2"), check=True, env=env, capture_output=True, timeout=900)
    one, resumed = metric_records(tmp_path / "one" / "metrics.jsonl"), metric_records(killed / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
    for a, b in zip(one, resumed):
        for key in a:
            if key.startswith(("rollout/", "val/")) and not key.endswith("_s") and not _where_it_ran(key):
                assert b[key] == a[key], (a["step"], key)
