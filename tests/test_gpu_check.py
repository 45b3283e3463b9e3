"""benchmarks/gpu_check.py: its FLOPs / MFU arithmetic, the figures it reads from the stages' metrics,
and the script itself on a CPU with a tiny model (slow tier; every path but CUDA); gpu_check.sh's
caps (a part past its cap is killed with its stages and fails, a call without time left starts
nothing) and its account of what each part skipped (benchmarks/gpu_check_report.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)
_report_spec = importlib.util.spec_from_file_location("gpu_check_report", ROOT / "benchmarks" / "gpu_check_report.py")
report = importlib.util.module_from_spec(_report_spec)
_report_spec.loader.exec_module(report)


def test_mfu_is_six_n_t_over_time_and_peak():
    # 0.5e9 parameters x 1e4 tokens: 6 x 5e12 = 3e13 FLOPs; in 0.1 s that is 3e14 FLOP/s of 989e12.
    assert gpu_check.training_flops(500_000_000, 10_000) == pytest.approx(3e13)
    assert gpu_check.model_flops_utilisation(500_000_000, 10_000, 0.1, 989e12) == pytest.approx(3e14 / 989e12)
    assert gpu_check.model_flops_utilisation(1, 1, 1.0, 6.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="positive"):
        gpu_check.model_flops_utilisation(1, 1, 0.0, 6.0)


def test_peak_flops_default_is_h100_h200_bf16_and_the_env_overrides_it():
    value, source = gpu_check.peak_flops_from_env({})
    assert value == 989e12 and "H100/H200" in source
    assert gpu_check.peak_flops_from_env({"GPU_CHECK_PEAK_FLOPS": "312e12"}) == (312e12, "GPU_CHECK_PEAK_FLOPS=312e12")
    with pytest.raises(ValueError, match="GPU_CHECK_PEAK_FLOPS"):
        gpu_check.peak_flops_from_env({"GPU_CHECK_PEAK_FLOPS": "fast"})
    with pytest.raises(ValueError, match="> 0"):
        gpu_check.peak_flops_from_env({"GPU_CHECK_PEAK_FLOPS": "0"})


def test_sft_figures_leave_out_the_warmup_steps_and_weigh_steps_by_time():
    records = [
        {"step": 1, "tokens_per_s": 100.0, "step_time_s": 10.0, "loss": 7.0, "pad_fraction": 0.5},  # warm-up
        {"step": 2, "tokens_per_s": 1000.0, "step_time_s": 1.0, "loss": 6.0, "pad_fraction": 0.2},
        {"step": 3, "tokens_per_s": 3000.0, "step_time_s": 3.0, "loss": 5.0, "pad_fraction": 0.4},
    ]
    figures = gpu_check.sft_throughput(records, parameters=1_000_000, peak_flops=1e12, warmup_steps=1)
    # steady: 1000 + 9000 tokens in 4 s = 2500 tokens/s; 6 x 1e6 x 2500 / 1e12 = 1.5 %
    assert figures["tokens"] == pytest.approx(10_000) and figures["seconds"] == pytest.approx(4.0)
    assert figures["tokens_per_s"] == pytest.approx(2500.0)
    assert figures["mfu"] == pytest.approx(0.015)
    assert figures["pad_fraction"] == pytest.approx(0.3)
    assert (figures["steps"], figures["steady_steps"], figures["loss_first"], figures["loss_last"]) == (3, 2, 7.0, 5.0)
    with pytest.raises(ValueError, match="warm-up"):
        gpu_check.sft_throughput(records, 1, 1e12, warmup_steps=3)


def _grpo_record(step: int, input_tokens: float, update_s: float) -> dict:
    return {
        "step": step,
        "timing/step_s": 20.0,
        "timing/update_s": update_s,
        "actor/input_tokens": input_tokens,
        "timing/generate_s": 8.0,
        "rollout/generated_tokens_mean": 50.0,
        "rollout/trajectories": 16.0,
        "rollout/response_length_mean": 60.0,
        "rollout/reward_mean": -1.0,
    }


def test_grpo_figures_come_from_the_update_time_and_the_last_step():
    records = [
        {"step": 0, "val/arith/avg@4": 0.0},  # validation before training: no update
        _grpo_record(1, 4000.0, 4.0),
        _grpo_record(2, 6000.0, 2.0),
    ]
    figures = gpu_check.grpo_throughput(records, parameters=1_000_000, peak_flops=1e12)
    assert [s["step"] for s in figures["steps"]] == [1, 2]
    assert figures["steps"][0]["train_tokens_per_s"] == pytest.approx(1000.0)
    assert figures["train_tokens_per_s"] == pytest.approx(3000.0)
    assert figures["mfu"] == pytest.approx(6 * 1e6 * 6000 / 2.0 / 1e12)
    assert figures["rollout_tokens_per_s"] == pytest.approx(50 * 16 / 8.0)
    with pytest.raises(ValueError, match="no training step"):
        gpu_check.grpo_throughput(records[:1], 1, 1e12)


def test_parameter_count_from_safetensors_headers_matches_the_model(tmp_path):
    from agentrl.config import load_config
    from agentrl.model.build import build_tiny_qwen3, count_parameters, train_tokenizer

    cfg = load_config({"model": {"embedded": gpu_check.SIZES["tiny"]["model"]}}).model.embedded
    model = build_tiny_qwen3(train_tokenizer(["0123456789 abc"], 300, "qwen3"), cfg, seed=0)
    assert model.config.tie_word_embeddings  # the shared matrix must count once
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert gpu_check.safetensors_parameter_count(tmp_path) == count_parameters(model)
    with pytest.raises(FileNotFoundError, match="safetensors"):
        gpu_check.safetensors_parameter_count(tmp_path / "missing")


def test_sft_config_runs_at_least_the_asked_steps():
    size = gpu_check.SIZES["0.5b"]
    cfg = gpu_check.sft_config(size, steps=40, examples=768, dtype="bfloat16")
    steps_per_epoch = 768 // cfg["global_batch_size"]
    assert cfg["epochs"] * steps_per_epoch >= 40 > (cfg["epochs"] - 1) * steps_per_epoch
    assert cfg["deepspeed"] == {"zero_stage": 2, "dtype": "bfloat16", "gradient_checkpointing": False}
    with pytest.raises(ValueError, match="no step"):
        gpu_check.sft_config(size, steps=1, examples=3, dtype="bfloat16")


def test_the_stage_configs_pass_the_config_schema():
    from agentrl.config import load_config
    from agentrl.grpo.trainer import check_config

    for size in gpu_check.SIZES.values():
        load_config(
            {
                "sft": gpu_check.sft_config(size, size["sft_steps"], 768, "bfloat16"),
                "model": {"embedded": size["model"]},
            }
        )
        check_config(load_config(gpu_check.grpo_config(size, 2, "bfloat16")))
        check_config(load_config(gpu_check.lora_grpo_config(gpu_check.grpo_config(size, 2, "bfloat16"))))


def test_a_failing_stage_stops_the_check_with_its_log_tail(tmp_path):
    log = tmp_path / "sft.log"
    with pytest.raises(gpu_check.StageFailed, match=r"sft failed \(exit 2\)[\s\S]*does not exist"):
        gpu_check.run_stage(
            "sft",
            [
                "--model",
                str(tmp_path / "missing"),
                "--data",
                str(tmp_path / "missing.parquet"),
                "--out",
                str(tmp_path / "out"),
                "--metrics",
                str(tmp_path / "m.jsonl"),
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
            ],
            {},
            log,
            time.monotonic() + 120,
        )


def test_a_stage_past_the_time_limit_is_killed(tmp_path):
    started = time.monotonic()
    with pytest.raises(gpu_check.StageFailed, match="time limit"):
        gpu_check.run_stage(
            "prepare-data",
            [
                "--sft",
                str(tmp_path / "s.parquet"),
                "--rl-pool",
                str(tmp_path / "r.parquet"),
                "--eval-dir",
                str(tmp_path / "eval"),
            ],
            {"data": {"embedded": {"sft_per_family": 5000}}},
            tmp_path / "p.log",
            started + 1.0,
        )
    assert time.monotonic() - started < 30
    assert not (tmp_path / "s.parquet").exists()


def _script_env(**extra: str) -> dict[str, str]:
    # A launcher's rendezvous keys that an in-process trainer of an earlier test left would point
    # the script at that test's port: the script runs as a user starts it, without them.
    launcher = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_") and k not in launcher}
    return {**env, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without GPU")
def test_without_a_gpu_the_check_refuses_to_run(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), str(tmp_path / "s.json")],
        capture_output=True,
        text=True,
        env=_script_env(),
        timeout=120,
    )
    assert done.returncode != 0
    assert "no CUDA GPU" in done.stderr
    assert not (tmp_path / "s.json").exists()


@pytest.mark.long  # CI: the DeepSpeed parts (the test without vllm) and tests/test_gpu_check_vllm.py
@pytest.mark.slow
def test_the_script_runs_every_stage_on_a_cpu_with_a_tiny_model(tmp_path):
    """Both calls, every part within its cap; only the CUDA parts 3b and 3c are skipped (vLLM's
    2a too where vllm is not installed), so the exit status is 3."""
    done, summary_path = _run_script(tmp_path, (), 900)
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    parts = _parts(done.stdout)
    assert set(parts) == {"1", "2", "3", "4"}, done.stdout[-3000:]
    for part, (result, seconds, cap) in parts.items():
        assert result in ("PASSED", "SKIPPED-OK") and seconds <= cap, (part, result, seconds, cap)
    assert "gpu_check:   3b: skipped: no CUDA device [needs CUDA: exit 3 on a CPU run]" in done.stdout
    summary = json.loads(summary_path.read_text())
    assert summary["peak_flops"] == 1e11 and summary["model"]["parameters"] > 0
    sft, grpo = summary["sft"], summary["grpo"]
    assert sft["steps"] >= 4 and sft["tokens_per_s"] > 0 and sft["loss_last"] < sft["loss_first"]
    expected = gpu_check.model_flops_utilisation(summary["model"]["parameters"], sft["tokens"], sft["seconds"], 1e11)
    assert sft["mfu"] == pytest.approx(expected)
    assert len(grpo["steps"]) == 2 and grpo["train_tokens_per_s"] > 0
    lora = summary["grpo_lora"]  # the one-GPU preset's GRPO: only the rank-8 adapters train
    assert lora["steps"] == 2 and lora["train_tokens_per_s"] > 0
    assert 0 < lora["adapter_share"] < 0.5 and lora["full_train_tokens_per_s"] == grpo["train_tokens_per_s"]
    # the stage logs come packed: one archive to copy back from the node
    assert not (summary_path.parent / "gpu_check_logs").exists()
    with tarfile.open(summary_path.parent / "gpu_check_logs.tar.gz") as tar:
        assert "ZeRO-2, torch.bfloat16" in tar.extractfile("gpu_check_logs/sft.log").read().decode()
        metrics = tar.extractfile("gpu_check_logs/sft_metrics.jsonl").read().decode()
    assert len(metrics.splitlines()) == sft["steps"]
    # part 2: each of its parts passed, or was skipped because vllm is missing here
    engine_parts = json.loads((summary_path.parent / "gpu_check_vllm.json").read_text())
    for part in ("a_engine", "b_long_sequence", "c_decode"):
        status = engine_parts[part]["status"]
        assert status == "passed" or status == "skipped: vllm not importable on this machine", (part, status)
    assert engine_parts["c_decode"]["status"] == "passed"
    paper_path = json.loads((summary_path.parent / "gpu_check_paper_path.json").read_text())
    assert paper_path["a"]["status"] == "passed", paper_path
    assert paper_path["b"] == paper_path["c"] == {"status": "skipped: no CUDA device"}


def _hidden(tmp_path, *modules: str) -> str:
    """A PYTHONPATH entry whose sitecustomize makes ``modules`` unimportable in every Python process
    of the script (None in sys.modules: `import` fails and importlib.util.find_spec returns None)."""
    hide = tmp_path / "hide"
    hide.mkdir(exist_ok=True)
    updates = ", ".join(f"{m}=None" for m in modules)
    (hide / "sitecustomize.py").write_text(f"import sys\nsys.modules.update({updates})\n")
    return str(hide)


def _run_script(
    tmp_path, hidden: tuple[str, ...], timeout: int, *args: str, site: Path | None = None, **env_extra: str
) -> tuple[subprocess.CompletedProcess, Path]:
    """gpu_check.sh on a CPU, tiny size; ``hidden`` modules unimportable, or ``site`` (a folder with a
    sitecustomize) on the path: a process runs one sitecustomize, the first it finds."""
    assert not (hidden and site), "one sitecustomize or the other"
    summary_path = tmp_path / "out" / "gpu_check.json"
    env = _script_env(GPU_CHECK_ALLOW_CPU="1", GPU_CHECK_PEAK_FLOPS="1e11", **env_extra)
    if hidden or site:
        env["PYTHONPATH"] = f"{site or _hidden(tmp_path, *hidden)}{os.pathsep}{env['PYTHONPATH']}"
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(summary_path), "--size", "tiny", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return done, summary_path


def _parts(stdout: str) -> dict[str, tuple[str, int, int]]:
    """Part -> (result, seconds, cap) from the lines "gpu_check: part N: RESULT in S s of its C s cap"."""
    pattern = r"^gpu_check: part (\d): (\S+) in (\d+) s of its (\d+) s cap"
    return {m[0]: (m[1], int(m[2]), int(m[3])) for m in re.findall(pattern, stdout, re.M)}


def test_without_jsonschema_the_check_stops_before_any_stage_naming_it(tmp_path):
    done, summary_path = _run_script(tmp_path, ("jsonschema",), timeout=120)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "not importable here: jsonschema (pip: jsonschema)" in done.stderr
    assert "no part was started" in done.stderr
    assert not summary_path.parent.exists(), "nothing ran, nothing was written"


def test_without_deepspeed_its_parts_are_skipped_the_rest_run_and_the_check_fails(tmp_path):
    """deepspeed (and vllm) unimportable: part 1, 2b, 3 and 4 are reported skipped with the reason,
    none as passed, 2c measures the hf engine; DeepSpeed can be carried, so its skips fail the
    check (exit 1), where vLLM's alone would exit 3."""
    done, summary_path = _run_script(tmp_path, ("deepspeed", "vllm"), timeout=300)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert (
        "part 1 (SFT and GRPO stages, hf engine, DeepSpeed ZeRO-2): SKIPPED, not importable: deepspeed "
        "(counts as FAILED: carry it)" in done.stdout
    )
    assert json.loads(summary_path.read_text()) == {"status": "skipped: deepspeed not importable on this machine"}
    parts = json.loads((summary_path.parent / "gpu_check_vllm.json").read_text())
    assert parts["a_engine"]["status"] == "skipped: vllm not importable on this machine", parts
    assert parts["b_long_sequence"]["status"] == "skipped: deepspeed not importable on this machine", parts
    assert parts["c_decode"]["status"] == "passed" and parts["c_decode"]["engine"] == "hf", parts
    paper_path = json.loads((summary_path.parent / "gpu_check_paper_path.json").read_text())
    assert all(part["status"].startswith("skipped: ") for part in paper_path.values()), paper_path
    assert json.loads((summary_path.parent / "gpu_check_packing.json").read_text())["status"].startswith("skipped")
    final = done.stdout[done.stdout.index("---- this call's parts ----") :]
    assert "gpu_check: part 1: SKIPPED (counts as failed" in final
    assert "gpu_check:   1: skipped: deepspeed not importable on this machine [counts as FAILED" in final
    assert "gpu_check:   2a: skipped: vllm not importable on this machine [needs vLLM on CUDA: exit 3]" in final
    assert "gpu_check:   2b: skipped: deepspeed not importable on this machine [counts as FAILED" in final
    assert "gpu_check: part 4: SKIPPED" in final and "gpu_check: exit 1" in final


@pytest.mark.slow
@pytest.mark.long  # CI: parts 1 and 4 on torch 2.11's varlen (below), part 2 without vLLM (test_gpu_check_vllm.py)
def test_without_vllm_every_other_part_runs_and_the_check_exits_with_the_skip_code(tmp_path):
    done, summary_path = _run_script(tmp_path, ("vllm",), timeout=900)
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    assert "part 2a (colocated vLLM engine): SKIPPED, not importable: vllm (needs vLLM: exit 3)" in done.stdout
    assert "part 1 (SFT and GRPO stages, hf engine, DeepSpeed ZeRO-2): runs" in done.stdout
    summary = json.loads(summary_path.read_text())
    assert summary["sft"]["mfu"] > 0 and summary["grpo"]["rollout_tokens_per_s"] > 0, "MFU and hf-engine tokens/s"
    parts = json.loads((summary_path.parent / "gpu_check_vllm.json").read_text())
    assert parts["b_long_sequence"]["status"] == "passed" and parts["b_long_sequence"]["beside_sleeping_vllm"] is False
    assert parts["a_engine"]["status"].startswith("skipped") and parts["c_decode"]["engine"] == "hf"
    assert json.loads((summary_path.parent / "gpu_check_paper_path.json").read_text())["a"]["status"] == "passed"
    packing = json.loads((summary_path.parent / "gpu_check_packing.json").read_text())
    assert packing["packed/padded"]["time_ratio_median"] > 0, packing
    assert {part: result for part, (result, _, _) in _parts(done.stdout).items()} == {
        "1": "PASSED",
        "2": "SKIPPED-OK",
        "3": "SKIPPED-OK",
        "4": "PASSED",
    }


@pytest.mark.slow
def test_the_packed_parts_run_on_torch_2_11s_varlen_attn_within_their_caps(tmp_path):
    """Parts 1 and 4 (GRPO's packed update, packed against padded) with torch 2.11.0's varlen.py
    in place of this torch's, its kernel on CPU and packed rows on the flash branch, as on the
    GPU node's torch 2.11: both pass within their caps, and the substituted kernel ran
    forward and backward in the GRPO stages and in the packed arm."""
    calls = tmp_path / "varlen_calls.txt"
    site = ROOT / "tests" / "helpers" / "varlen_2_11_site"
    done, summary_path = _run_script(tmp_path, (), 900, "--part", "1,4", site=site, AGENTRL_VARLEN_CALLS=str(calls))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    parts = _parts(done.stdout)
    assert set(parts) == {"1", "4"}
    for part, (result, seconds, cap) in parts.items():
        assert result == "PASSED" and seconds <= cap, (part, result, seconds, cap)
    lines = calls.read_text().splitlines()
    grpo = [line for line in lines if "'grpo'" in line]
    arms = [line for line in lines if "packing.py" in line]
    assert grpo and arms, lines
    for line in grpo + arms:
        forward, backward = (int(x) for x in re.findall(r"(?:forward|backward)=(\d+)", line))
        assert forward > 0 and backward > 0, line
    assert json.loads(summary_path.read_text())["grpo"]["train_tokens_per_s"] > 0


def test_a_call_without_time_left_starts_no_part_and_fails(tmp_path):
    """The call's budget bounds every part: a part that could not get 20 s is not started, and a
    part not run is a failure; a bad --call is refused before anything runs."""
    done, _ = _run_script(tmp_path, ("vllm",), 120, "--part", "4", GPU_CHECK_CALL_S="30")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpu_check: part 4: FAILED (not started: too little of the call's time left)" in done.stdout
    assert "part 4: started" not in done.stdout
    refused = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--call", "3"],
        capture_output=True,
        text=True,
        env=_script_env(GPU_CHECK_ALLOW_CPU="1"),
        timeout=60,
    )
    assert refused.returncode == 2 and "the calls are 1 and 2" in refused.stderr


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and text in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


@pytest.mark.slow
def test_a_part_past_its_cap_is_killed_with_its_stages_and_fails(tmp_path):
    """Part 1 under a 25-s cap and no time limit of its own: timeout's SIGTERM at the cap stops
    it, its running stage (in a session of its own, which the signal does not reach) is killed
    too, the summary records why, and the part fails: killed at its cap."""
    workdir = tmp_path / "work"
    started = time.monotonic()
    done, summary_path = _run_script(
        tmp_path,
        ("vllm",),
        180,
        "--call",
        "1",
        "--workdir",
        str(workdir),
        GPU_CHECK_CAP_1="25",
        GPU_CHECK_TIME_LIMIT_S="1000",
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert time.monotonic() - started < 25 + 10 + 60, "the cap, timeout's grace and the import check"
    result, seconds, cap = _parts(done.stdout)["1"]
    assert (result, cap) == ("FAILED", 25) and seconds <= 25 + 10
    assert "gpu_check: part 1: FAILED in" in done.stdout and "(killed at its cap of 25 s)" in done.stdout
    assert "stopped by SIGTERM" in json.loads(summary_path.read_text())["error"]
    time.sleep(1)
    assert _processes_mentioning(str(workdir)) == [], "a stage outlived the cap"


def test_the_report_fails_any_skip_but_vllm_and_cuda_on_a_cpu_run():
    vllm_skip = {"status": "skipped: vllm not importable on this machine"}
    cpu_skip = {"status": "skipped: no CUDA device"}
    passed = {"status": "passed"}
    on_gpu = report.outcome("2", 3, 100, {"a_engine": vllm_skip, "b_long_sequence": passed, "c_decode": passed}, False)
    assert on_gpu["result"] == "skipped-ok" and on_gpu["subs"]["2a"] == vllm_skip["status"]
    # no CUDA is an acceptable skip only where the run is on a CPU by request
    assert report.outcome("3", 3, 80, {"a": passed, "b": cpu_skip, "c": cpu_skip}, True)["result"] == "skipped-ok"
    assert report.outcome("3", 3, 80, {"a": passed, "b": cpu_skip, "c": cpu_skip}, False)["result"] == "skipped"
    deepspeed = report.outcome("1", 3, 240, {"status": "skipped: deepspeed not importable on this machine"}, False)
    assert deepspeed["result"] == "skipped"
    assert report.outcome("4", 124, 60, None, False) == {
        "part": "4",
        "result": "failed",
        "why": "killed at its cap of 60 s",
        "subs": {},
    }
    assert report.outcome("1", 1, 240, {"error": "sft failed (exit 2)"}, False)["why"] == (
        "exit 1: 1 failed: sft failed (exit 2)"
    )
    # a part that says "skipped" (exit 3) without naming what is a failure, not a pass
    assert report.outcome("2", 3, 100, {"a_engine": passed}, False)["result"] == "failed"
    assert report.outcome("2", 0, 100, {"a_engine": passed, "b_long_sequence": passed}, False)["result"] == "passed"
    assert report.exit_status([on_gpu, {"result": "passed"}]) == 3
    assert report.exit_status([on_gpu, deepspeed]) == 1
    assert report.exit_status([{"result": "passed"}]) == 0
    assert report.exit_status([]) == 1, "nothing run is not a pass"
