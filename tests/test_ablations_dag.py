"""`snakemake -n ablations` on the embedded default: the arms share the upstream stages they can.

A dry run in an empty folder plans every job: one real data set, one base model, one real SFT
model and one model-aware RL set serve every arm; each other sft_data an arm names (stitched,
deliberative, reactive) adds one data set and one SFT model for all its seeds; each arm and seed is
one grpo job and one evaluate job of every benchmark.
Slow: each Snakemake call pays its start-up and DAG building (several seconds here).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers.workflows import ROOT, job_counts, run_snakemake, shell_commands, stage_config

pytestmark = pytest.mark.slow

CONFIG = yaml.safe_load((ROOT / "config.yaml").read_text())
ABLATIONS = CONFIG["ablations"]
ARMS = list(dict.fromkeys(a for q in ("data", "algorithm", "reasoning") for a in ABLATIONS["questions"][q]))
SEEDS = ABLATIONS["seeds"]
# The SFT data sets of their own the arms need: one data set and one SFT model each.
SFT_DATA = sorted({ABLATIONS["arms"][arm]["sft_data"] for arm in ARMS} - {"real"})
FAMILIES = CONFIG["data"]["embedded"]["families"]


def _dry_run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return run_snakemake(workdir, *args, "-n", "--configfile", str(ROOT / "config.yaml"), timeout=300)


def _jobs(output: str, rule: str) -> list[dict[str, str]]:
    """The ``input:``/``output:`` lines of each planned job of ``rule``."""
    jobs = []
    for block in output.split(f"rule {rule}:\n")[1:]:
        fields = {}
        for line in block.splitlines():
            match = re.match(r"^\s+(input|output): (.*)$", line)
            if match:
                fields[match.group(1)] = match.group(2)
            if line.startswith("[") or line.startswith("rule ") or line.startswith("Job stats"):
                break
        jobs.append(fields)
    return jobs


@pytest.fixture(scope="module")
def planned_in(tmp_path_factory) -> tuple[Path, str]:
    """(the dry run's folder, its listing with the shell commands)."""
    workdir = tmp_path_factory.mktemp("ablations_dag")
    done = _dry_run(workdir, "ablations", "-p")
    assert done.returncode == 0, f"snakemake -n ablations failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return workdir, done.stdout + done.stderr


@pytest.fixture(scope="module")
def plan(planned_in) -> str:
    return planned_in[1]


def test_arms_share_one_data_set_base_model_sft_model_and_rl_set(plan):
    counts = job_counts(plan)
    for shared in (
        "prepare_data",
        "base_model",
        "copy_corpus",
        "pretrain",
        "sft",
        "score_rl_pool",
        "select_rl_data",
        "ablation_report",
        "ablations",
    ):
        assert counts.get(shared) == 1, f"{shared}: {counts.get(shared)} jobs planned, expected exactly one"
    assert SFT_DATA == ["deliberative", "reactive", "stitched"]
    assert counts["ablation_sft_data"] == counts["ablation_sft"] == len(SFT_DATA)
    assert counts["ablation_grpo"] == len(ARMS) * len(SEEDS)  # the baseline, shared by the three questions, once
    assert counts["ablation_evaluate"] == len(ARMS) * len(SEEDS)
    for job in _jobs(plan, "ablation_evaluate"):  # each evaluates every family of its arm and seed's model
        run = re.search(r"ablations/([^/]+/seed\d+)/rl/", job["input"]).group(1)
        expected = {
            f"results/ablations/{run}/eval/{f}/{file}" for f in FAMILIES for file in ("samples.jsonl", "metrics.json")
        }
        assert set(job["output"].split(", ")) == expected, job
    assert len(SEEDS) >= 3
    # the main workflow's own RL and evaluation are not part of the ablations target
    assert "grpo" not in counts and "evaluate" not in counts


def test_each_arm_trains_from_its_sft_model_on_its_rl_data(plan):
    jobs = _jobs(plan, "ablation_grpo")
    assert len(jobs) == len(ARMS) * len(SEEDS)
    for job in jobs:
        arm = re.search(r"ablations/([^/]+)/seed\d+/rl/", job["output"]).group(1)
        spec = ABLATIONS["arms"][arm]
        sft = (
            "results/models/sft/config.json"
            if spec["sft_data"] == "real"
            else f"results/ablations/shared/{spec['sft_data']}_sft/model/config.json"
        )
        data = "results/filter/rl_train.parquet" if spec["rl_data"] == "filtered" else "results/data/rl_pool.parquet"
        assert job["input"].split(", ")[:2] == [sft, data], (arm, job["input"])
    sft_jobs = sorted(_jobs(plan, "ablation_sft"), key=lambda job: job["input"])
    assert [job["input"].split(", ") for job in sft_jobs] == [
        [
            "results/models/pretrained/config.json",  # the model the main SFT starts from: only the data differs
            f"results/ablations/shared/{sft_data}_data/sft.parquet",  # stitched keeps its paths of before
        ]
        for sft_data in SFT_DATA
    ]


def test_each_sft_data_set_is_the_main_data_with_one_key_changed(planned_in):
    """The data sets of the SFT-data arms: the main run's data config but for the one key their
    sft_data names, so the SFT data's kind is the only difference (the same problems, pool and eval sets)."""
    workdir, listing = planned_in
    configs = {}
    for command in shell_commands(listing):
        if "-m agentrl prepare-data " in command:
            folder = command.split("--sft ", 1)[1].split()[0]
            configs[folder] = stage_config(command, workdir)
    main = configs.pop("results/data/sft.parquet")
    changed = {"stitched": ("sft_trajectories", "stitched"), "deliberative": ("reasoning_mode", "deliberative")}
    changed["reactive"] = ("reasoning_mode", "reactive")
    assert sorted(configs) == [f"results/ablations/shared/{sft_data}_data/sft.parquet" for sft_data in SFT_DATA]
    for sft_data in SFT_DATA:
        key, value = changed[sft_data]
        config = configs[f"results/ablations/shared/{sft_data}_data/sft.parquet"]
        assert config == {**main, "data": {**main["data"], "embedded": {**main["data"]["embedded"], key: value}}}


def test_the_default_target_plans_no_ablation_job(tmp_path):
    done = _dry_run(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not any(rule.startswith("ablation") for rule in job_counts(done.stdout + done.stderr))


def test_a_question_naming_an_undefined_arm_stops_the_workflow_at_load(tmp_path):
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump({"ablations": {"questions": {"data": ["baseline", "no_such_arm"]}}}))
    done = run_snakemake(
        tmp_path,
        "ablations",
        "-n",
        "--configfile",
        str(ROOT / "config.yaml"),
        str(override),
        timeout=300,
        cores=1,
    )
    assert done.returncode != 0
    assert "'ablations.questions.data' names undefined arm(s) ['no_such_arm']" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
