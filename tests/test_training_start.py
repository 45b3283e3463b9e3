"""A CPU training start cannot wedge the host: kills during the first minute on a fresh
torch-extensions cache, a stale build lock, no compiler left behind.

DeepSpeed's CPU backend used to JIT-compile ``deepspeed_shm_comm`` under a lock file in the
extensions cache at the first start (60-160 s); a kill during the build left the lock and every
later start waited on it forever. Each test uses its own ``TORCH_EXTENSIONS_DIR``, never the
shared ``~/.cache/torch_extensions``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.sft_runs import sft_env, sft_run_args

pytestmark = pytest.mark.slow

SFT = {"epochs": 1, "global_batch_size": 4, "micro_batch_size": 2, "lr": 1e-2, "max_length": 512}
START_TIMEOUT_S = 240  # a hang on a build lock never ends; a healthy tiny run takes well under a minute


def _env(extensions: Path) -> dict[str, str]:
    return {**sft_env(), "TORCH_EXTENSIONS_DIR": str(extensions)}


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that name ``text`` (a compiler building into the cache)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and str(os.getpid()) != entry.name:
                found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def _finish(tiny_sft_workspace: Path, name: str, extensions: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            sft_run_args(tiny_sft_workspace, name, SFT, 1),
            env=_env(extensions),
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"the training start hung for {START_TIMEOUT_S} s: {(exc.stderr or b'')[-2000:]!r}"
        ) from None


def _steps(run: Path) -> list[int]:
    import json

    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_kills_in_the_first_minute_on_a_fresh_extensions_cache_then_a_restart_finishes(tiny_sft_workspace, tmp_path):
    extensions = tmp_path / "torch_extensions"
    moments = sorted(random.Random(26).uniform(2.0, 60.0) for _ in range(3))
    for moment in moments:
        process = subprocess.Popen(
            sft_run_args(tiny_sft_workspace, "killed", SFT, 1),
            env=_env(extensions),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + moment
        while time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # the job's process group, as a scheduler kills it
        process.wait()
    time.sleep(1.0)
    assert _processes_mentioning(str(extensions)) == [], "a compiler outlived the job"

    done = _finish(tiny_sft_workspace, "killed", extensions)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _steps(tiny_sft_workspace / "killed") == list(range(1, 7)), "every step once"
    assert not list(extensions.rglob("lock")), "no build lock left"


def test_a_stale_build_lock_in_the_extensions_cache_does_not_hold_a_start(tiny_sft_workspace, tmp_path):
    extensions = tmp_path / "torch_extensions"
    for build in ("py311_cpu/deepspeed_shm_comm", "deepspeed_shm_comm"):  # with and without torch's prefix
        (extensions / build).mkdir(parents=True)
        (extensions / build / "lock").write_text("")  # what a build killed half-way leaves
    done = _finish(tiny_sft_workspace, "locked", extensions)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _steps(tiny_sft_workspace / "locked") == list(range(1, 7))
