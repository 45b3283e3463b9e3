"""Watching a run: progress lines in log files, TensorBoard and W&B (offline) curves, and a missing
tracking package found before any work.

The SFT stage runs for real (a subprocess of the CLI, stderr to a file as under Snakemake) on a
tiny Qwen3 and a few real tool-use conversations.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.config import ConfigError, load_config
from agentrl.data.prompts import CODE_INTERPRETER_TOOL
from agentrl.data.records import SftExample, write_records
from agentrl.progress import ProgressLines
from agentrl.tracking import Tracker, check_tracking

ROOT = Path(__file__).resolve().parents[1]


def test_progress_lines_every_five_percent_with_rate_and_eta(caplog):
    caplog.set_level(logging.INFO, logger="agentrl.test")
    bar = ProgressLines(200, "test", unit="steps", initial=20, logger=logging.getLogger("agentrl.test"))
    for _ in range(180):
        bar.set_postfix(loss="0.5")
        bar.update(1)
    bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 18, lines  # 10 steps each, from the resumed step 20 to 200
    assert lines[0].startswith("test: 30/200 steps (15%) | ") and "ETA " in lines[0] and lines[0].endswith("loss=0.5")
    assert lines[-1].startswith("test: 200/200 steps (100%) | ") and "ETA" not in lines[-1]
    assert " steps/s | " in lines[0] and "elapsed " in lines[0]


def test_progress_lines_close_shows_the_last_count(caplog):
    caplog.set_level(logging.INFO, logger="agentrl.test")
    bar = ProgressLines(1000, "test", logger=logging.getLogger("agentrl.test"))
    bar.update(7)
    bar.close()
    assert [r.getMessage().split(" | ")[0] for r in caplog.records] == ["test: 7/1000 it (1%)"]


def shadow_packages(folder: Path, *names: str) -> Path:
    """A folder whose packages ``names`` fail to import: first on the path, as if not installed."""
    for name in names:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text("raise ImportError('not installed')\n")
    return folder


def test_a_missing_tracking_package_names_the_key(monkeypatch, tmp_path):
    cfg = load_config({"tracking": {"tensorboard": True, "wandb": {"enable": True}}}).tracking
    monkeypatch.syspath_prepend(str(shadow_packages(tmp_path, "tensorboard", "wandb")))
    for name in ("tensorboard", "wandb"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ConfigError) as error:
        check_tracking(cfg)
    assert "tracking.tensorboard is on but tensorboard is not installed" in str(error.value)
    assert "tracking.wandb.enable is on but wandb is not installed: pip install -e '.[wandb]'" in str(error.value)


def test_tracker_writes_tensorboard_events_and_an_offline_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config({"tracking": {"tensorboard": True, "wandb": {"enable": True, "mode": "offline"}}}).tracking
    tracker = Tracker(cfg, tmp_path, "grpo", fresh=True, run_config={"lr": 1e-4})
    for step in (1, 2):
        tracker.log({"step": step, "loss": 1.0 / step, "note": "text", "done": True})
    tracker.close()
    events = list((tmp_path / "tracking" / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    assert accumulator.Tags()["scalars"] == ["loss"]
    assert [(e.step, round(e.value, 3)) for e in accumulator.Scalars("loss")] == [(1, 1.0), (2, 0.5)]
    run_id = (tmp_path / "tracking" / "wandb" / "run_id").read_text()
    (offline_run,) = (tmp_path / "tracking" / "wandb" / "wandb").glob(f"offline-run-*-{run_id}")
    assert list(offline_run.glob("run-*.wandb")), "the offline run holds its records for `wandb sync`"


def test_tracker_writes_tensorboard_events_without_torch(tmp_path):
    """The evaluation's gather job tracks its metrics in envs/report.yaml, which has no torch."""
    pytest.importorskip("tensorboard")
    shadow = shadow_packages(tmp_path / "shadow", "torch")
    script = (
        "import sys\n"
        "from agentrl.config import load_config\n"
        "from agentrl.tracking import Tracker\n"
        "tracker = Tracker(load_config({'tracking': {'tensorboard': True}}).tracking, sys.argv[1], 'eval', True)\n"
        "tracker.log({'avg@1': 0.25}, step=0)\n"
        "tracker.close()\n"
        "assert 'torch' not in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{shadow}:{ROOT / 'src'}"}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(tmp_path / "tracking" / "tensorboard"))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars("avg@1")] == [(0, 0.25)]


def test_an_evaluation_shard_with_a_missing_tracking_package_stops_before_sampling(sft_inputs, tmp_path):
    """Not only at the gather job, after every shard has sampled its problems."""
    from helpers.rollout import arith_problems

    write_records(arith_problems(2), tmp_path / "arith.parquet")
    shadow = shadow_packages(tmp_path / "shadow", "wandb")
    # a 16-token budget with no overlong penalty: its window (128 tokens) would not fit the budget
    config = {"eval": {"n": 1}, "rollout": {"max_response_tokens": 16, "max_turns": 1}, "reward": {"overlong": {"enable": False}}, "tracking": {"wandb": {"enable": True}}}  # fmt: skip
    out = tmp_path / "shards" / "0-of-1.jsonl"
    command = [sys.executable, "-m", "agentrl", "evaluate", "shard", "--config-json", json.dumps(config)]
    command += ["--model", str(sft_inputs / "base"), "--problems", str(tmp_path / "arith.parquet")]
    command += ["--benchmark", "arith", "--shard", "0", "--shards", "1", "--out", str(out), "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT / 'src'}:{shadow}"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "tracking.wandb.enable is on but wandb is not installed: pip install -e '.[wandb]'" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists(), "nothing was sampled"


def test_the_workflow_with_a_missing_tracking_package_stops_at_load(tmp_path):
    from helpers.workflows import snakemake_command

    (tmp_path / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    shadow = shadow_packages(tmp_path / "shadow", "wandb")
    command = snakemake_command(tmp_path, "-n", "--config", "tracking={wandb: {enable: true}}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT / 'src'}:{shadow}"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)
    assert done.returncode != 0, done.stdout[-3000:]
    assert "tracking: a package is missing" in done.stderr
    assert "tracking.wandb.enable is on but wandb is not installed: pip install -e '.[wandb]'" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) < 5, done.stderr
    assert "Job stats" not in done.stdout + done.stderr, "no job was planned"


# --------------------------------------------------------------------------- the SFT stage
def _conversation(index: int) -> SftExample:
    a, b = 37 + 11 * index, 5 + 3 * index
    messages = [
        {"role": "user", "content": f"Compute {a} * {b}. Use the code tool, then answer in \\boxed{{}}."},
        {
            "role": "assistant",
            "content": "Let me compute it.",
            "tool_calls": [
                {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": f"print({a}*{b})"}}}
            ],
        },
        {"role": "tool", "content": f"{a * b}\n"},
        {"role": "assistant", "content": f"\\boxed{{{a * b}}}"},
    ]
    return SftExample(id=f"arith-{index}", messages=messages, tools=[CODE_INTERPRETER_TOOL])


@pytest.fixture(scope="module")
def sft_inputs(tmp_path_factory):
    from helpers.sft_runs import sft_workspace
    from helpers.tiny_models import SFT_TRACKING

    root = tmp_path_factory.mktemp("sft-tracking")
    return sft_workspace(root, [_conversation(i) for i in range(8)], SFT_TRACKING)


def _sft(
    root: Path, run: str, config: dict, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, str]:
    out = root / run
    out.mkdir()
    log = out / "sft.log"
    command = [sys.executable, "-m", "agentrl", "sft", "--config-json", json.dumps(config)]
    command += ["--model", str(root / "base"), "--data", str(root / "sft.parquet"), "--out", str(out / "model")]
    command += ["--metrics", str(out / "checkpoints" / "metrics.jsonl"), "--checkpoint-dir", str(out / "checkpoints")]
    command += ["--nproc", "0"]
    base_env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true", "PYTHONPATH": str(ROOT / "src")}
    with open(log, "w") as fh:  # a file, as Snakemake's `> {log} 2>&1`
        done = subprocess.run(
            command, stdout=fh, stderr=subprocess.STDOUT, timeout=600, env={**base_env, **(env or {})}
        )
    return done, log.read_text()


@pytest.mark.slow
def test_sft_logs_progress_lines_and_tracks_to_tensorboard_and_wandb(sft_inputs):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    config = {
        "sft": {"epochs": 5, "global_batch_size": 2, "micro_batch_size": 2, "max_length": 1024, "save_every_steps": 0},
        "tracking": {"tensorboard": True, "wandb": {"enable": True, "mode": "offline"}},
    }
    done, log = _sft(sft_inputs, "tracked", config)
    assert done.returncode == 0, log[-3000:]
    assert "\r" not in log, "no carriage-return bar in a log file"
    lines = [line for line in log.splitlines() if "agentrl.sft: sft: " in line]
    assert len(lines) == 20 and lines[-1].split("agentrl.sft: ")[1].startswith("sft: 20/20 steps (100%)"), lines
    assert "ETA " in lines[0] and "loss=" in lines[0]
    run = sft_inputs / "tracked"
    assert "metrics: " in log and len((run / "checkpoints" / "metrics.jsonl").read_text().splitlines()) == 20
    assert list((run / "tracking" / "tensorboard").glob("events.out.tfevents.*"))
    assert list((run / "tracking" / "wandb" / "wandb").glob("offline-run-*"))


@pytest.mark.slow
def test_sft_with_a_missing_tracking_package_stops_before_training(sft_inputs, tmp_path):
    shadow = shadow_packages(tmp_path, "tensorboard")
    config = {"sft": {"epochs": 1}, "tracking": {"tensorboard": True}}
    done, log = _sft(sft_inputs, "untracked", config, env={"PYTHONPATH": f"{ROOT / 'src'}:{shadow}"})
    assert done.returncode == 2, log[-3000:]
    assert "tracking.tensorboard is on but tensorboard is not installed" in log
    assert not (sft_inputs / "untracked" / "checkpoints").exists(), "nothing was trained"
