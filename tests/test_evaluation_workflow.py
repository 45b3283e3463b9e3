"""The evaluate / export / report rules in Snakemake: one job per (model, benchmark), inputs by config.

A small Snakefile in a temporary folder includes the repository's ``rules/common.smk``,
``rules/eval.smk`` and ``rules/report.smk`` (unchanged) with the repository's config and schema;
the upstream stages' outputs (model folders, eval sets, training logs, filter stats) are plain
files there, so the dry runs show exactly what these rules plan. Slow: each Snakemake call pays
its start-up.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.workflows import job_counts, rules_snakefile, snakemake

pytestmark = pytest.mark.slow

WRAPPER = rules_snakefile(
    "eval.smk", "report.smk", extra="rule all:\n    input: REPORT_TARGETS, LIVECODEBENCH_EXPORTS\n"
)


def _dry_run(workdir: Path, *args: str) -> tuple[dict[str, int], str]:
    done = snakemake(workdir, "-n", "-p", *args, timeout=300, snakefile=workdir / "Snakefile", cores=1)
    out = done.stdout + done.stderr
    return job_counts(out), out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eval_workflow")
    (root / "Snakefile").write_text(WRAPPER)
    # The default pretrains the embedded model before SFT: the cost table reads that stage too.
    sources = [f"results/models/{m}/config.json" for m in ("base", "pretrained", "sft", "rl")]
    sources += [f"results/data/eval/{b}.parquet" for b in ("arith", "choice", "program")]
    sources += [
        "results/pretrain/metrics.jsonl",
        "results/sft/metrics.jsonl",
        "results/rl/metrics.jsonl",
        "results/filter/stats.json",
        "results/filter/pass_rate_hist.png",
        "results/filter/samples.jsonl",  # the scoring's tokens, for the report's cost table
        # a released checkpoint is checked as a model folder at load: config, weights, tokenizer, chat template
        "ckpt/step_30/config.json",
        "ckpt/step_30/pytorch_model.bin",
        "ckpt/step_30/tokenizer.json",
        "ckpt/step_30/chat_template.jinja",
    ]
    for source in sources:
        (root / source).parent.mkdir(parents=True, exist_ok=True)
        (root / source).write_text("{}")
    return root


def test_every_model_and_benchmark_is_one_job_and_code_benchmarks_are_exported(workdir):
    counts, out = _dry_run(workdir)
    # The default evaluates the sft and rl models (the embedded base is a random initialisation).
    assert counts == {"evaluate": 6, "gather_evaluation": 6, "export_livecodebench": 2, "report": 1, "all": 1}
    assert "--sft-metrics results/sft/metrics.jsonl --sft-plot results/report/training_sft.png" in out
    assert "--filter-stats results/filter/stats.json" in out
    for model in ("sft", "rl"):
        assert f"results/eval/{model}/program/livecodebench_custom_outputs.json" in out
        assert f"results/eval/{model}/arith/livecodebench_custom_outputs.json" not in out
    assert "results/eval/base/" not in out
    counts, _ = _dry_run(workdir, "--config", "eval={models: [base, sft, rl]}")
    assert counts == {"evaluate": 9, "gather_evaluation": 9, "export_livecodebench": 3, "report": 1, "all": 1}


def test_one_target_is_one_job(workdir):
    counts, _ = _dry_run(workdir, "results/eval/sft/arith/metrics.json")
    assert counts == {"evaluate": 1, "gather_evaluation": 1}


def test_models_and_checkpoints_come_from_the_config(workdir):
    override = workdir / "override.yaml"
    override.write_text(yaml.safe_dump({"eval": {"models": ["base"], "checkpoints": {"rl_step30": "ckpt/step_30"}}}))
    counts, out = _dry_run(workdir, "--configfile", str(override))
    assert counts == {"evaluate": 6, "gather_evaluation": 6, "export_livecodebench": 2, "report": 1, "all": 1}
    assert "ckpt/step_30/config.json" in out and "results/eval/rl_step30/choice/metrics.json" in out
    # Without the trained stages evaluated, their logs and the filter stats are not inputs.
    assert "--sft-metrics" not in out and "--rl-metrics" not in out and "--filter-stats" not in out


def test_each_reasoning_half_has_its_jobs_folder_and_flag(workdir):
    both = workdir / "both_halves.yaml"
    both.write_text(yaml.safe_dump({"eval": {"reasoning": ["agentic", "self_contained"]}}))
    counts, out = _dry_run(workdir, "--configfile", str(both))
    assert counts == {"evaluate": 12, "gather_evaluation": 12, "export_livecodebench": 4, "report": 1, "all": 1}
    commands = [line for line in out.splitlines() if "python -m agentrl evaluate shard" in line]
    no_tool = [c for c in commands if "--reasoning self_contained" in c]
    assert len(no_tool) == 6 and all("/self_contained/" in c for c in no_tool)
    assert all("--reasoning agentic" in c and "/self_contained/" not in c for c in commands if c not in no_tool)
    assert "results/eval/rl/self_contained/program/livecodebench_custom_outputs.json" in out
    assert "results/eval/rl/self_contained/arith/metrics.json" in out and "results/eval/rl/arith/metrics.json" in out
    counts, out = _dry_run(workdir, "results/eval/sft/self_contained/arith/metrics.json")
    assert counts == {"evaluate": 1, "gather_evaluation": 1} and "--reasoning self_contained" in out
