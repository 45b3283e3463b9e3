"""presets/one-gpu.yaml: the paper recipe on one GPU with LoRA for SFT and GRPO and a colocated vLLM
engine resolves to what docs/paper-scale.md ("One GPU") estimates, passes the load-time checks, and
`snakemake -n` plans it with the local profile on one GPU: every GPU job on that GPU, the
training stages one process each with their adapters, no scoring pass."""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers.presets import resolved
from helpers.workflows import ROOT, jobs_in_listing, rules_of, stage_config

from agentrl.config import cross_key_problems, process_count_problems, rollout_placement


@pytest.fixture(scope="module")
def one_gpu():
    return resolved("paper-qwen3-4b.yaml", "one-gpu.yaml")


def test_the_preset_trains_lora_adapters_beside_a_colocated_vllm_engine_at_ten_times_the_paper_lr(one_gpu):
    paper = resolved("paper-qwen3-4b.yaml")
    assert one_gpu.model.base == "Qwen/Qwen3-4B-Instruct-2507" and one_gpu.results_dir == "results-one-gpu"
    for stage, rank in ((one_gpu.sft, 32), (one_gpu.grpo, 8)):
        assert stage.lora.enabled and stage.lora.rank == rank and stage.lora.target_modules == ("all-linear",)
        assert stage.deepspeed.zero_stage == 2 and stage.deepspeed.dtype == "bfloat16"
    assert one_gpu.sft.lr == pytest.approx(10 * paper.sft.lr) and one_gpu.grpo.lr == pytest.approx(10 * paper.grpo.lr)
    assert one_gpu.rollout.engine == "vllm" and rollout_placement(one_gpu.grpo) == "colocated"
    assert one_gpu.filter.selection == "pool", "no scoring pass on one GPU"
    # the budget docs/paper-scale.md estimates
    g = one_gpu.grpo
    assert (g.max_steps, g.batch_prompts, g.n, g.mini_batch_prompts) == (100, 32, 8, 8)
    assert (one_gpu.sft.epochs, g.validation.n, one_gpu.eval.n) == (3, 4, 8)
    assert cross_key_problems(one_gpu) == [] and process_count_problems(g, 1) == []
    # what the paper preset fixes stays: the algorithm, rewards and sampling
    assert (g.variant, g.ppo_epochs) == (paper.grpo.variant, paper.grpo.ppo_epochs)
    assert one_gpu.reward == paper.reward and one_gpu.rollout.max_response_tokens == 20480


@pytest.mark.timeout(300)
def test_a_dry_run_on_one_gpu_plans_every_gpu_job_on_it_and_no_scoring(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTRL_GPUS_PER_NODE", "AGENTRL_NODES")}
    env |= {"AGENTRL_GPUS_PER_NODE": "1", "PYTHONPATH": str(ROOT / "src")}
    presets = ["presets/paper-qwen3-4b.yaml", "presets/one-gpu.yaml"]
    done = subprocess.run(
        ["snakemake", "-n", "-p", "--profile", "profiles/local", "--configfile", *presets],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    listing = done.stdout + done.stderr
    assert done.returncode == 0, listing[-3000:]
    rules = rules_of(jobs_in_listing(listing))
    assert {"sft", "grpo", "evaluate", "report"} <= rules and "score_rl_pool" not in rules, rules
    commands = [
        line for line in listing.splitlines() if line.startswith("Shell command:") and "agentrl.devices" in line
    ]
    assert commands and all("agentrl.devices --gpus 1 -- " in c for c in commands), "one GPU for every GPU job"
    for stage, rank in (("sft", 32), ("grpo", 8)):
        (command,) = [c for c in commands if f"-m agentrl {stage} " in c]
        assert "--nproc 1 " in command
        config = stage_config(command.removeprefix("Shell command: "), ROOT)
        assert config[stage]["lora"] == {
            "enabled": True,
            "rank": rank,
            "alpha": 32,
            "dropout": 0.0,
            "target_modules": ["all-linear"],
            "modules_to_save": [],  # Qwen3 knows its own chat template's tokens
        }
    assert "results-one-gpu/data/rl_pool.parquet" in next(c for c in commands if "-m agentrl grpo " in c)
