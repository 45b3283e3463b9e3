"""Re-evaluating one model on every benchmark: the command docs/operations.md gives, planned by dry runs.

``--forcerun`` of a metrics file re-runs only its gather (the shards stay as they are); the
documented command samples the model again: that model's metrics files as the targets and
``--forcerun evaluate`` (after them: it takes every word that follows), so that the forced evaluate jobs are its shards only, then a plain run for what
reads them (the LiveCodeBench exports, the report). The finished run here is the tiny workflow's
files written empty and recorded by ``snakemake --touch``: Snakemake then plans as after a real run,
in seconds.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
from helpers.workflows import (
    ROOT,
    SNAKEFILE,
    TINY,
    jobs_in_listing,
    models_of,
    planned,
    rules_of,
    snakemake,
    snakemake_env,
    write_config,
)

BENCHMARKS = {"arith", "program"}  # TINY's families
DOC = ROOT / "docs" / "operations.md"


def documented_command() -> str:
    """The re-evaluation command of docs/operations.md (the code line after its heading)."""
    section = DOC.read_text().split("To re-evaluate one model on every benchmark", 1)[1]
    return re.search(r"```bash\n\s*(.+?)\n\s*```", section, re.S)[1].split("  #", 1)[0].strip()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A folder where the tiny workflow counts as finished: its outputs exist and are recorded."""
    workdir = tmp_path_factory.mktemp("finished")
    write_config(workdir, TINY, {"eval": {"reasoning": ["agentic", "self_contained"]}})
    listing = snakemake(workdir, "-n", timeout=180).stdout
    for line in listing.splitlines():
        if line.startswith("    output: "):
            for path in line.removeprefix("    output: ").split(", "):
                (workdir / path).parent.mkdir(parents=True, exist_ok=True)
                (workdir / path).write_text("finished\n")
    snakemake(workdir, "--touch", timeout=180)
    assert planned(workdir) == [], "a finished run plans nothing"
    return workdir


def _plan(workdir, shell_command: str) -> list[tuple[str, dict[str, str]]]:
    """The jobs of ``snakemake ...`` as a shell runs it in ``workdir``, planned with -n."""
    runner = f"{shlex.quote(sys.executable)} -m snakemake -s {shlex.quote(str(SNAKEFILE))} -n"
    command = re.sub(r"^snakemake\b", runner, shell_command.strip())
    done = subprocess.run(
        ["bash", "-c", command], cwd=workdir, env=snakemake_env(), capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, (command, done.stderr[-3000:])
    return jobs_in_listing(done.stdout + done.stderr)


def test_forcerun_of_a_metrics_file_gathers_again_without_sampling(finished):
    jobs = _plan(finished, "snakemake --cores 1 --forcerun results/eval/rl/arith/metrics.json")
    assert "gather_evaluation" in rules_of(jobs) and "evaluate" not in rules_of(jobs), jobs


def test_the_documented_command_samples_that_model_again_on_every_benchmark(finished):
    command = documented_command()
    assert command.startswith("snakemake --cores all $(find results/eval/rl ") and " && " in command
    sample, rebuild = command.split(" && ")
    jobs = _plan(finished, sample)
    assert rules_of(jobs) == {"evaluate", "gather_evaluation"}, jobs
    assert models_of(jobs, "evaluate") == models_of(jobs, "gather_evaluation") == {"rl"}
    halves = {(w["half"], w["benchmark"]) for rule, w in jobs if rule == "evaluate"}
    assert halves == {(half, b) for half in ("", "self_contained/") for b in BENCHMARKS}, "both halves, every set"
    # once that ran, the plain run rebuilds what reads the new samples and metrics, for rl only
    for path in (finished / "results" / "eval" / "rl").rglob("*"):
        if path.name in ("samples.jsonl", "metrics.json"):
            path.write_text("sampled again\n")
    after = _plan(finished, rebuild)
    assert rules_of(after) == {"export_livecodebench", "report"}, after
    assert models_of(after, "export_livecodebench") == {"rl"}
