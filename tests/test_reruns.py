"""Partial reruns and preemption of the embedded default workflow, through Snakemake.

What the README promises: ``--until`` plans only what its target needs; ``--forcerun evaluate``
re-plans evaluation and what consumes it, nothing upstream; a changed config value re-runs only the
stages it feeds (each rule's ``params:`` holds just the config it reads); a training job killed
the way SLURM preempts one (SIGKILL to the whole process group) resumes from its checkpoint when
Snakemake runs it again, because the checkpoint folder is a param, not an output Snakemake removes.

Plans are read from dry runs (``-n``): each job block of the dry-run listing gives a rule and its
wildcards. The workflow runs on the smallest config that still runs every rule (as
tests/test_workflow_e2e.py does, smaller still). Slow tier but the listing parser: about a minute per
real run on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal

import pytest
import yaml
from helpers.workflows import (
    TINY,
    UPSTREAM_OF_EVAL,
    jobs_in_listing,
    models_of,
    planned,
    rules_of,
    snakemake,
    start_snakemake,
    wait_for,
    write_config,
)

from agentrl.config.loading import load_config

MODELS = {"base", "sft", "rl"}
# A (model, benchmark) is sampled by its eval.shards evaluate jobs and gathered into its metrics.
EVALUATION = {"evaluate", "gather_evaluation", "export_livecodebench", "report"}


def test_the_listing_parser_reads_rules_and_wildcards():
    listing = (
        "Job stats:\njob count\n\n[Mon]\nrule evaluate:\n    input: a\n    wildcards: model=sft, benchmark=arith\n"
        "[Mon]\nlocalrule report:\n    reason: forced\n[Mon]\nlocalrule all:\n    input: x\n"
    )
    assert jobs_in_listing(listing) == [("evaluate", {"model": "sft", "benchmark": "arith"}), ("report", {})]


@pytest.mark.slow
@pytest.mark.parametrize(
    "target, expected",
    [
        ("base_model", {"prepare_data", "base_model"}),
        (
            "select_rl_data",
            {
                "prepare_data",
                "base_model",
                "copy_corpus",
                "pretrain",
                "fit_rl_prompts",
                "sft",
                "scoring_config",
                "score_rl_pool",
                "gather_pass_rates",
                "select_rl_data",
            },
        ),
    ],
)
def test_until_plans_only_the_jobs_upstream_of_its_target(tmp_path, target, expected):
    write_config(tmp_path, TINY)
    everything = planned(tmp_path)
    assert rules_of(everything) >= UPSTREAM_OF_EVAL | EVALUATION - {"export_livecodebench"}, (
        "a fresh folder plans the whole DAG"
    )
    jobs = planned(tmp_path, "--until", target)
    assert rules_of(jobs) == expected
    assert len(jobs) == len(expected), "one job per rule upstream of the target"


@pytest.fixture(scope="module")
def completed(tmp_path_factory):
    """A folder where the whole tiny workflow has run: nothing is left to do."""
    workdir = tmp_path_factory.mktemp("reruns")
    write_config(workdir, TINY)
    snakemake(workdir, timeout=900)
    assert planned(workdir) == [], "a finished run plans nothing"
    return workdir


@pytest.mark.slow
def test_forcerun_evaluate_replans_evaluation_and_its_consumers_only(completed):
    jobs = planned(completed, "--forcerun", "evaluate")
    assert rules_of(jobs) == EVALUATION
    evaluations = [w for rule, w in jobs if rule == "evaluate"]
    assert {(w["model"], w["benchmark"]) for w in evaluations} == {(m, b) for m in MODELS for b in ("arith", "program")}
    assert models_of(jobs, "export_livecodebench") == MODELS  # LiveCodeBench files are made from the samples


@pytest.mark.slow
@pytest.mark.parametrize(
    "overlay, reruns, evaluated_models",
    [
        # selection thresholds: the cheap selection, not the scoring rollouts of score_rl_pool
        ({"filter": {"high": 0.99}}, {"select_rl_data", "grpo"}, {"rl"}),
        # how the pool is scored: scoring and what follows, not SFT
        (
            {"filter": {"k": 2}},
            {"score_rl_pool", "gather_pass_rates", "scoring_config", "select_rl_data", "grpo"},
            {"rl"},
        ),
        # SFT: the SFT model and everything built on it, not the data or the base model
        (
            {"sft": {"lr": 1.0e-3}},
            {"sft", "score_rl_pool", "gather_pass_rates", "scoring_config", "select_rl_data", "grpo"},
            {"sft", "rl"},
        ),
        ({"grpo": {"lr": 5.0e-5}}, {"grpo"}, {"rl"}),
        # the copying pretraining: it, SFT and everything after, not the base model or the corpus
        (
            {"model": {"embedded": {"pretrain": {"lr": 1.0e-3}}}},
            {"pretrain", "sft", "score_rl_pool", "gather_pass_rates", "scoring_config", "select_rl_data", "grpo"},
            {"sft", "rl"},
        ),
        # the copying corpus: it, the pretraining and everything after, not the base model
        (
            {"model": {"embedded": {"pretrain": {"verbatim_share": 0.5}}}},
            {
                "copy_corpus",
                "pretrain",
                "sft",
                "score_rl_pool",
                "gather_pass_rates",
                "scoring_config",
                "select_rl_data",
                "grpo",
            },
            {"sft", "rl"},
        ),
        # SFT's schedule is its own: pretraining has model.embedded.pretrain.lr_schedule
        (
            {"sft": {"lr_schedule": "constant"}},
            {"sft", "score_rl_pool", "gather_pass_rates", "scoring_config", "select_rl_data", "grpo"},
            {"sft", "rl"},
        ),
        # an sft key pretraining shares (the SFT recipe's own epochs, batch, lr and warmup are not)
        (
            {"sft": {"weight_decay": 0.0}},
            {"pretrain", "sft", "score_rl_pool", "gather_pass_rates", "scoring_config", "select_rl_data", "grpo"},
            {"sft", "rl"},
        ),
    ],
    ids=[
        "filter.high",
        "filter.k",
        "sft.lr",
        "grpo.lr",
        "pretrain.lr",
        "pretrain.verbatim_share",
        "sft.lr_schedule",
        "sft.weight_decay",
    ],
)
def test_a_changed_parameter_reruns_only_what_it_feeds(completed, tmp_path, overlay, reruns, evaluated_models):
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump(overlay))
    jobs = planned(completed, "--configfile", str(completed / "config.yaml"), str(override))
    assert rules_of(jobs) == reruns | EVALUATION
    assert models_of(jobs, "evaluate") == evaluated_models, "only the models the change feeds are re-evaluated"
    assert models_of(jobs, "export_livecodebench") == evaluated_models


@pytest.mark.slow
@pytest.mark.parametrize(
    "overlay",
    [
        {"sandbox": {"workers": 3, "sandbox_fusion_url": "http://sandbox:8080", "preload_modules": ["math"]}},
        {"sft": {"save_every_steps": 7, "keep_checkpoints": 3}, "grpo": {"save_freq": 5, "keep_checkpoints": 1}},
        {"tracking": {"tensorboard": True}},
        {"rollout": {"vllm": {"gpu_memory_utilization": 0.8, "max_num_seqs": 64, "enforce_eager": False}}},
    ],
    ids=["sandbox-workers", "checkpoint-intervals", "tracking", "engine-memory"],
)
def test_speed_and_bookkeeping_keys_rerun_nothing(completed, tmp_path, overlay):
    """Keys the schema marks ``x-rerun: false`` reach the stages (params.cfg) but are not compared."""
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump(overlay))
    assert planned(completed, "--configfile", str(completed / "config.yaml"), str(override)) == []


def _eval_shards_plan(completed, tmp_path) -> list[tuple[str, dict[str, str]]]:
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump({"eval": {"shards": 2}}))
    return planned(completed, "--configfile", str(completed / "config.yaml"), str(override))


@pytest.mark.slow
def test_a_new_eval_shard_count_samples_every_evaluation_in_new_shards(completed, tmp_path):
    """eval.shards re-splits each (model, benchmark): its shard jobs and its gather, nothing upstream."""
    jobs = _eval_shards_plan(completed, tmp_path)
    shards = {(w["model"], w["benchmark"], w["shard"], w["shards"]) for rule, w in jobs if rule == "evaluate"}
    assert shards == {(m, b, s, "2") for m in MODELS for b in ("arith", "program") for s in ("0", "1")}
    assert len([rule for rule, _ in jobs if rule == "evaluate"]) == len(shards), "one job per shard"
    assert {(w["model"], w["benchmark"]) for rule, w in jobs if rule == "gather_evaluation"} == {
        (m, b) for m in MODELS for b in ("arith", "program")
    }
    assert not rules_of(jobs) & UPSTREAM_OF_EVAL, rules_of(jobs)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="Snakemake re-runs what reads a gather it runs (the report, the LiveCodeBench exports), though the "
    "gathered files are the same for any shard count; rules/eval.smk has no guard like rules/filter.smk's "
    "(ancient() pass rates and scoring_config) yet",
)
def test_a_new_eval_shard_count_reruns_only_the_evaluation_shards_and_gathers(completed, tmp_path):
    jobs = _eval_shards_plan(completed, tmp_path)
    assert rules_of(jobs) == {"evaluate", "gather_evaluation"}, "not report or export_livecodebench"


@pytest.mark.slow
def test_a_rerun_reason_names_the_changed_keys(completed, tmp_path):
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump({"grpo": {"lr": 5.0e-5, "save_freq": 3}}))
    done = snakemake(completed, "-n", "--configfile", str(completed / "config.yaml"), str(override), timeout=180)
    reasons = [line.strip() for line in done.stdout.splitlines() if "Params have changed" in line]
    assert len(reasons) == 1, done.stdout[-3000:]  # the grpo job; what reads its model re-runs for its input
    before = load_config(TINY).grpo.lr  # the finished run's rate, whatever the default is
    assert f"before: 'grpo.lr={before}' now: 'grpo.lr=5e-05'" in reasons[0]
    assert "save_freq" not in reasons[0] and len(reasons[0]) < 300, reasons[0]


@pytest.mark.slow
def test_a_changed_grpo_parameter_trains_grpo_again(completed, tmp_path):
    """The documented command, run once: GRPO trains again at the new rate (the old run's
    checkpoint set aside beside its folder, not resumed), and the report is built from it."""
    workdir = tmp_path / "run"
    shutil.copytree(completed, workdir, symlinks=True)  # the shared finished run stays as it is
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump({"grpo": {"lr": 5.0e-5}}))
    checkpoints = workdir / "results" / "rl" / "checkpoints"
    old_step = (checkpoints / "latest").read_text().strip()
    snakemake(workdir, "--configfile", str(workdir / "config.yaml"), str(override))
    log = (workdir / "results" / "logs" / "grpo.log").read_text()
    assert "resumed from" not in log, "the new configuration resumed the old run's final checkpoint"
    aside = checkpoints.with_name(f"checkpoints.{old_step}")
    # the log names paths relative to the run's folder, as the user types them
    assert f"it is kept in {aside.relative_to(workdir)}" in log and "differs in grpo.lr" in log, log[-2000:]
    assert (aside / old_step / "trainer_state.json").exists()
    records = [json.loads(line) for line in (workdir / "results" / "rl" / "metrics.jsonl").read_text().splitlines()]
    rates = [r["actor/lr"] for r in records if "actor/lr" in r]
    assert rates and max(rates) == pytest.approx(5e-5, rel=1e-6), rates  # the new rate (after any warmup)
    summary = workdir / "results" / "report" / "summary.md"
    assert summary.stat().st_mtime > (workdir / "results" / "rl" / "metrics.jsonl").stat().st_mtime


@pytest.mark.slow
def test_a_model_retrained_by_a_partial_run_is_evaluated_again(completed, tmp_path):
    """``--until sft`` stops before evaluation; the next plain run must still evaluate the new SFT model.

    Snakemake (>= 9.18) skips the consumers of an input whose checksum is unchanged, and rules track
    a model by its config.json: the file must change with the weights (agentrl.model.folder).
    """
    workdir = tmp_path / "run"
    shutil.copytree(completed, workdir, symlinks=True)
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump({"sft": {"lr": 1.0e-3}}))
    configfiles = ("--configfile", str(workdir / "config.yaml"), str(override))
    # another sft.lr sets the old run's checkpoint aside and trains from step 0
    snakemake(workdir, *configfiles, "--until", "sft")
    jobs = planned(workdir, *configfiles)
    assert models_of(jobs, "evaluate") == {"sft", "rl"}
    assert {"score_rl_pool", "scoring_config", "select_rl_data", "grpo"} <= rules_of(jobs)


# --------------------------------------------------------------------------- preemption
# (rule, the overlay that makes it 12 steps of 2 conversations with a checkpoint every 2, its
# folders: checkpoints, model, metrics, and the line it logs at the end)
TRAINING_JOBS = {
    # 4 conversations x 2 families, 2 per step: 4 steps an epoch, 12 steps
    "sft": (
        {"sft": {"epochs": 3, "global_batch_size": 2, "micro_batch_size": 2}},
        ("sft/checkpoints", "models/sft", "sft/metrics.jsonl", "SFT done"),
    ),
    # the embedded model's copying pretraining: 24 conversations, 2 per step, one epoch
    "pretrain": (
        {"model": {"embedded": {"pretrain": {"conversations": 24, "global_batch_size": 2}}}},
        ("pretrain/checkpoints", "models/pretrained", "pretrain/metrics.jsonl", "pretraining done"),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "rule",
    # long: the pretraining is SFT's trainer with another recipe, so it stops, keeps and resumes
    # through the code the sft case runs; CI runs that one
    [pytest.param(rule, marks=pytest.mark.long) if rule == "pretrain" else rule for rule in sorted(TRAINING_JOBS)],
)
def test_a_killed_training_job_resumes_from_its_checkpoint(tmp_path, rule):
    overlay, (checkpoint_dir, model_dir, metrics, done_line) = TRAINING_JOBS[rule]
    write_config(tmp_path, TINY, overlay, {"sft": {"save_every_steps": 2, "keep_checkpoints": 1}})
    total = 12
    results = tmp_path / "results"
    checkpoints = results / checkpoint_dir
    log_path = results / "logs" / f"{rule}.log"

    # Its own session: the process group holds snakemake and the jobs it runs, as a SLURM job's cgroup does.
    first = start_snakemake(tmp_path, "--until", rule)
    try:
        wait_for(lambda: (checkpoints / "latest").exists(), 300, f"first {rule} checkpoint", first)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # preemption: no chance to clean up
        first.wait()
    assert not (results / model_dir / "config.json").exists(), f"{rule} finished before the kill: no preemption"
    saved_step = int((checkpoints / "latest").read_text().removeprefix("step_"))
    assert 2 <= saved_step < total
    log_before = log_path.read_text()
    assert "resumed" not in log_before

    # The killed run still holds Snakemake's lock; the requeued job's snakemake finds it released.
    snakemake(tmp_path, "--unlock")
    # The checkpoint folder is not an output: Snakemake plans the incomplete job without removing it.
    rerun_plan = planned(tmp_path, "--until", rule, "--rerun-incomplete")
    assert rules_of(rerun_plan) == {rule}, "the finished upstream jobs are not re-run"
    assert (checkpoints / "latest").exists()

    done = snakemake(tmp_path, "--until", rule, "--rerun-incomplete")
    assert rules_of(jobs_in_listing(done.stdout + done.stderr)) == {rule}
    log_after = log_path.read_text()
    resumed = re.search(r"resumed from \S+ after step (\d+)", log_after)
    assert resumed, f"the rerun did not resume:\n{log_after[-3000:]}"
    assert int(resumed[1]) == saved_step, "it resumed from the newest checkpoint"
    assert f"{done_line}: {total} steps ({total - saved_step} this run)" in log_after
    assert (results / model_dir / "config.json").exists()
    # Every step once: those before the checkpoint kept from the killed run, none repeated.
    steps = [json.loads(line)["step"] for line in (results / metrics).read_text().splitlines()]
    assert steps == list(range(1, total + 1)), steps
    assert planned(tmp_path, "--until", rule) == [], f"after the rerun, {rule} is complete"
