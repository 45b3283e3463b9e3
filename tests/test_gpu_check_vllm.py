"""benchmarks/gpu_check_vllm.py (part 2 of benchmarks/gpu_check.sh): a missing package skips its
part (never "passed"), a failing part is reported and the others still run, the decode-speed
arithmetic and its hf-engine form (where vLLM is missing), the rollout config it builds, and (vllm
tier) the whole script on a CPU with the tiny size: every part passes, with vLLM-CPU (no CUDA
graphs, no sleep mode)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check_vllm", ROOT / "benchmarks" / "gpu_check_vllm.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


def test_a_part_whose_package_is_missing_is_skipped_not_passed():
    ran = []
    result = check.run_part("a", ("no_such_package_for_gpu_check",), lambda: ran.append(1) or {})
    assert result["status"].startswith("skipped: no_such_package_for_gpu_check not importable")
    assert not ran, "the part's body must not run"
    assert check.run_part("b", ("json",), lambda: {"x": 1})["status"] == "passed"


def test_a_failing_part_is_reported_with_its_error():
    def boom():
        raise RuntimeError("out of memory")

    assert check.run_part("b", (), boom)["status"] == "failed: RuntimeError: out of memory"


def test_decode_speed_takes_the_prefill_out():
    # 16 prompts, 128 tokens: 2 s for one token (prefill), 6 s for all -> 16 x 127 / 4 s
    assert check.decode_tokens_per_s(16, 128, 2.0, 6.0) == pytest.approx(16 * 127 / 4.0)
    with pytest.raises(ValueError, match="decode time"):
        check.decode_tokens_per_s(16, 128, 3.0, 3.0)
    assert check.mean_gap([[0.0, -1.0], [-2.0]], [[0.5, -1.0], [-1.0]]) == pytest.approx(0.5)


def test_the_rollout_config_is_a_colocated_vllm_engine_with_cuda_graphs_on_the_gpu_size():
    cfg = check.rollout_config(check.SIZES["0.5b"])
    assert cfg.engine == "vllm" and cfg.vllm.sleep_mode and not cfg.vllm.enforce_eager
    assert cfg.max_prompt_tokens == 12288 and check.SIZES["0.5b"]["long_sequence"] >= 16384


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_the_script_runs_every_part_on_a_cpu_with_the_tiny_size(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(ROOT / "src")}
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    summary = tmp_path / "s.json"
    script = [sys.executable, str(ROOT / "benchmarks" / "gpu_check_vllm.py"), str(summary), "--size", "tiny"]
    done = subprocess.run(script, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(summary.read_text())
    for part in ("a_engine", "b_long_sequence", "c_decode"):
        assert result[part]["status"] == "passed", (part, result[part])
    assert all(result["a_engine"]["checks"].values())
    assert result["b_long_sequence"]["beside_sleeping_vllm"] is True
    assert set(result["c_decode"]["decode_tokens_per_s_by_context"]) == {"256", "512", "1024"}


def test_without_an_engine_parts_b_and_c_are_skipped_with_the_reason_never_passed():
    """vLLM installed but part a built no engine: c is skipped with a's failure; without vLLM at
    all c has an engine to measure, the hf one (no reason to skip)."""
    ran = []
    a_failed = {"status": "failed: RuntimeError: CUDA out of memory"}
    reason = check.no_engine_reason({}, a_failed)
    if importlib.util.find_spec("vllm") is None:
        assert reason is None
        reason = "skipped: part a built no vLLM engine (failed: RuntimeError: CUDA out of memory)"
    else:
        assert reason == "skipped: part a built no vLLM engine (failed: RuntimeError: CUDA out of memory)"
    result = check.run_part("b", ("json",), lambda: ran.append(1) or {}, unless=f"{reason}: nothing to train beside")
    assert result["status"] == f"{reason}: nothing to train beside" and not ran, "b must not run or pass"
    assert check.no_engine_reason({"engine": object()}, {"status": "passed"}) is None


@pytest.mark.slow  # about 20 CPU seconds: 16 prompts x 128 tokens, twice per context
def test_without_vllm_the_decode_part_measures_the_hf_engine(tmp_path):
    """Part c on the hf engine (what it measures where vLLM is missing), tiny size on a CPU: a
    figure per context, every row decoding all its tokens (the engine never stops early)."""
    size = check.SIZES["tiny"]
    model_dir = check.build_model(size, tmp_path / "m")
    engine = check.hf_decode_engine({"model_dir": model_dir})
    assert engine.eos_ids == frozenset() and engine.batch_size == check.DECODE_BATCH
    from agentrl.rollout import SamplingParams

    outputs = engine.generate([[5, 6, 7]] * 2, SamplingParams(temperature=1.0, max_tokens=9, seed=0))
    assert [len(o.token_ids) for o in outputs] == [9, 9]
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size  # the embedded BPE stops below the size's
    small = {**size, "contexts": [64, 128], "model": {**size["model"], "vocab_size": vocab}}
    result = check.part_decode({"model_dir": model_dir}, small)
    assert result["engine"] == "hf" and set(result["decode_tokens_per_s_by_context"]) == {"64", "128"}
    assert all(v > 0 for v in result["decode_tokens_per_s_by_context"].values())
