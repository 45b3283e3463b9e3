"""The paper preset's GRPO settings against what its jobs run on, refused before any job starts.

- ``rollout.vllm.tensor_parallel_size > 1`` with GRPO on the vLLM engine: GRPO runs one engine per
  trainer rank (TP 1), so the workflow refuses it when it loads (``snakemake -n``), naming the key;
  an evaluation-only run (``eval.models`` without ``rl``) keeps its tensor parallelism.
- The GRPO job's process count (its GPUs: the workflow profile's ``gpu`` of the grpo rules) must divide
  ``grpo.batch_prompts`` and ``grpo.mini_batch_prompts``; the count is a Snakemake resource, not a
  config key, so the stage checks it when its ranks start and this file checks the workflow profile.
"""

from __future__ import annotations

import pytest
import yaml
from helpers.workflows import ROOT, run_snakemake

from agentrl.config import (
    ConfigError,
    check_cross_keys,
    cross_key_problems,
    load_config,
    load_config_file,
    process_count_problems,
)

PAPER = ROOT / "presets" / "paper-qwen3-4b.yaml"
TP_MESSAGE = "rollout.vllm.tensor_parallel_size = 2 with rollout.engine: vllm"


def _paper(**sections) -> dict:
    raw = yaml.safe_load(PAPER.read_text())
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return raw


def _with_tp(raw: dict, tp: int) -> dict:
    return {**raw, "rollout": {**raw["rollout"], "vllm": {**raw["rollout"]["vllm"], "tensor_parallel_size": tp}}}


def test_tensor_parallel_grpo_on_vllm_is_refused_at_load_and_evaluation_only_keeps_it():
    paper = _paper()
    assert paper["rollout"]["engine"] == "vllm" and "rl" in load_config(paper).eval.models
    check_cross_keys(load_config(paper))  # the preset as shipped is consistent
    problems = cross_key_problems(load_config(_with_tp(paper, 2)))
    assert [p for p in problems if TP_MESSAGE in p], problems
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.tensor_parallel_size = 2"):
        check_cross_keys(load_config(_with_tp(paper, 2)))
    # Nothing trained by GRPO (the released-models overlay: eval.models []): standalone engines may use TP.
    eval_only = _with_tp({**paper, "eval": {**paper.get("eval", {}), "models": []}}, 2)
    assert not [p for p in cross_key_problems(load_config(eval_only)) if "tensor_parallel_size" in p]
    # The hf engine has no tensor parallelism to refuse.
    hf = _with_tp({**paper, "rollout": {**paper["rollout"], "engine": "hf"}}, 2)
    assert not [p for p in cross_key_problems(load_config(hf)) if "tensor_parallel_size" in p]


@pytest.mark.timeout(300)
def test_a_dry_run_of_the_paper_preset_with_tensor_parallel_grpo_stops_naming_the_key(tmp_path):
    (tmp_path / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    done = run_snakemake(
        tmp_path,
        "-n",
        "--configfile",
        str(PAPER),
        "--config",
        "rollout={vllm: {tensor_parallel_size: 2}}",
        timeout=240,
    )
    assert done.returncode != 0, done.stdout[-2000:]
    assert TP_MESSAGE in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("processes", [0, 1, 2, 4, 8])
def test_the_paper_preset_splits_over_1_2_4_or_8_processes(processes):
    cfg = load_config_file(PAPER)
    assert (cfg.grpo.batch_prompts, cfg.grpo.mini_batch_prompts) == (64, 16), "docs/paper-scale.md quotes these"
    assert process_count_problems(cfg.grpo, processes) == []


@pytest.mark.parametrize("processes", [3, 5, 6, 7])
def test_a_process_count_that_does_not_divide_the_paper_batches_is_refused_with_the_counts_that_do(processes):
    (problem,) = process_count_problems(load_config_file(PAPER).grpo, processes)
    assert (
        f"grpo.batch_prompts (64) and grpo.mini_batch_prompts (16) must be multiples of the process count ({processes})"
        in problem
    )
    assert problem.endswith("these sizes run on 1, 2, 4, 8, 16 processes"), problem


def _profile_gpus(gpus_per_node: int, rule: str, monkeypatch) -> int:
    """The rule's gpu in the workflow profile (workflow/profiles/default) as Snakemake reads it."""
    import yte

    monkeypatch.setenv("AGENTRL_GPUS_PER_NODE", str(gpus_per_node))
    with open(ROOT / "workflow" / "profiles" / "default" / "config.yaml") as fh:
        return yte.process_yaml(fh, require_use_yte=True)["set-resources"][rule]["gpu"]


@pytest.mark.parametrize("gpus_per_node", [8, 4, 2, 1])
def test_the_workflow_profile_gives_the_grpo_job_a_process_count_the_paper_batches_split_over(
    gpus_per_node, monkeypatch
):
    gpus = _profile_gpus(gpus_per_node, "grpo", monkeypatch)
    assert gpus == gpus_per_node, gpus
    assert process_count_problems(load_config_file(PAPER).grpo, gpus) == []


@pytest.mark.parametrize("gpus_per_node", [8, 4])
def test_the_workflow_profile_gives_the_ablation_grpo_jobs_a_process_count_the_paper_ablation_batches_split_over(
    gpus_per_node, monkeypatch
):
    cfg = load_config_file(PAPER)
    gpus = _profile_gpus(gpus_per_node, "ablation_grpo", monkeypatch)
    assert process_count_problems(cfg.ablations.grpo, gpus, "ablations.grpo") == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("gpus, refused", [(6, True), (4, False)])
def test_a_dry_run_refuses_a_grpo_gpu_count_that_does_not_split_the_batches(tmp_path, gpus, refused):
    """The workflow reads the grpo rule's gpu resource (here --set-resources, as a profile sets it) at load."""
    (tmp_path / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    done = run_snakemake(tmp_path, "-n", "--configfile", str(PAPER), "--set-resources", f"grpo:gpu={gpus}", timeout=240)
    message = f"config: the grpo rule's gpu resource ({gpus}): grpo.batch_prompts (64) and grpo.mini_batch_prompts (16)"
    assert (done.returncode != 0) == refused, done.stderr[-3000:]
    assert (message in done.stderr) == refused, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


ASYNC = ROOT / "presets" / "paper-async.yaml"


@pytest.mark.timeout(600)
def test_the_one_step_off_overlay_plans_on_8_gpus_and_a_split_its_batches_or_gpus_cannot_take_stops_the_load(
    tmp_path, monkeypatch
):
    """presets/paper-async.yaml on the profile's 8-GPU grpo job: 4 GPUs roll out, 4 train, and the
    paper's batches split over the 4; a grpo.rollout_share leaving 5 trainer ranks, or one GPU for
    the trainer and a vLLM engine, is refused while the workflow loads, naming why."""
    (tmp_path / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    presets = ("--configfile", str(PAPER), str(ASYNC))
    monkeypatch.setenv("AGENTRL_GPUS_PER_NODE", "8")
    planned = run_snakemake(tmp_path, "-n", *presets, timeout=240)
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "grpo" in planned.stdout
    five = run_snakemake(tmp_path, "-n", *presets, "--config", "grpo={rollout_share: 0.375}", timeout=240)
    assert five.returncode != 0
    assert "gpu resource (8, 5 of them training beside the rollout engine" in five.stderr, five.stderr[-3000:]
    assert "must be multiples of the process count (5)" in five.stderr
    monkeypatch.setenv("AGENTRL_GPUS_PER_NODE", "1")
    one = run_snakemake(tmp_path, "-n", *presets, timeout=240)
    assert one.returncode != 0
    assert "rollout.engine: vllm needs two GPUs or more" in one.stderr, one.stderr[-3000:]
    assert "Traceback" not in one.stderr + five.stderr
