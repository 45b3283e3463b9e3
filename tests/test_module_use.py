"""The workflow used as a Snakemake module from another Snakefile plans the same jobs.

A lab's own workflow includes this one (``module agentrl: snakefile: ...; use rule * from
agentrl``): its paths must come from the folders of this workflow's files
(``workflow.current_basedir``), not from the including Snakefile's (``workflow.basedir``), or the
jobs would import another copy of the package than the checkout's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _jobs(workdir: Path, *args: str) -> list[dict]:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "helpers" / "slurm_submissions.py"),
            "all",
            "--directory",
            str(workdir),
            *args,
        ],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_workflow_as_a_module_plans_the_same_jobs(tmp_path):
    outer = tmp_path / "lab"
    outer.mkdir()
    (outer / "Snakefile").write_text(
        f'configfile: "{ROOT / "config.yaml"}"\n\n\n'
        f'module agentrl:\n    snakefile:\n        "{ROOT / "workflow" / "Snakefile"}"\n    config:\n        config\n\n\n'
        "use rule * from agentrl\n"
    )
    direct = tmp_path / "direct"
    direct.mkdir()
    as_module = _jobs(outer, "-s", str(outer / "Snakefile"))
    itself = _jobs(direct, "-s", str(ROOT / "workflow" / "Snakefile"), "--configfile", str(ROOT / "config.yaml"))

    def plan(jobs):
        return sorted((job["rule"], tuple(job["output"]), job["shell"], job["conda_env"] or "") for job in jobs)

    assert plan(as_module) == plan(itself)
    assert len(as_module) > 10
    # the jobs import the checkout's package, as they do without the module
    assert all(f"export PYTHONPATH={ROOT / 'src'}:" in job["shell_prefix"] for job in as_module)


def test_a_lab_workflow_with_a_config_of_its_own_and_prefixed_rules_plans_agentrls_jobs_under_its_folder(tmp_path):
    """The usual form in a lab's workflow: the module's config under a key of the lab's own config
    (another results folder, another seed), its rules renamed ``agentrl_*`` beside the lab's own."""
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "lab.yaml").write_text("samples: [a]\nagentrl:\n  results_dir: runs/agentrl\n  seed: 7\n")
    (lab / "Snakefile").write_text(
        'configfile: "lab.yaml"\n\n\n'
        f'module agentrl:\n    snakefile:\n        "{ROOT / "workflow" / "Snakefile"}"\n'
        '    config:\n        config["agentrl"]\n\n\n'
        "use rule * from agentrl as agentrl_*\n\n\n"
        "rule all:\n    input:\n        rules.agentrl_all.input,\n        'lab/summary.txt',\n\n\n"
        "rule lab_summary:\n    input:\n        'runs/agentrl/report/summary.md',\n"
        "    output:\n        'lab/summary.txt',\n    shell:\n        'cp {input} {output}'\n"
    )
    jobs = _jobs(lab, "-s", str(lab / "Snakefile"))
    rules = {job["rule"] for job in jobs}
    assert "lab_summary" in rules and {"agentrl_sft", "agentrl_grpo", "agentrl_report"} <= rules, rules
    assert all(rule.startswith("agentrl_") for rule in rules - {"lab_summary", "all"}), sorted(rules)
    outputs = [path for job in jobs if job["rule"].startswith("agentrl_") for path in job["output"]]
    # the lab's results_dir reached the module: every agentrl output is under it
    assert outputs and all(path.startswith("runs/agentrl/") for path in outputs), outputs[:5]
