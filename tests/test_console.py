"""What a run prints: short command lines, a failed job's reason, where the results are.

Each job's config reaches its stage as a file (rules/common.smk ``config_params``), so ``snakemake
-n -p`` prints commands a reader can follow and copy; a failed job prints its stage's error on the
console (rules/job_log.sh ``show_error``), and every run ends by naming the failed jobs with their
reasons and logs, or the report it built (rules/console.smk). Dry runs are the fast tier; the runs
are small (one failing job in seconds, a three-rule Snakefile) but run Snakemake for real.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

import pytest
import yaml
from helpers.workflows import ROOT, SNAKEFILE, rules_snakefile, run_snakemake, shell_commands, snakemake, stage_config

SMOKE = ("--configfile", str(ROOT / "config.yaml"), str(ROOT / "presets" / "smoke.yaml"))
# The failure of tests/test_kept_logs.py: a released SFT model by a hub id in no cache, offline.
FAILING = "sft: {from: nobody/no-such-model}\n"
REASON = "agentrl fetch-model: error: sft.from='nobody/no-such-model': not in the local hub cache"


def _config_path(command: str) -> str:
    words = shlex.split(command.split(" 2>&1 ", 1)[0])
    return words[words.index("--config") + 1]


def test_a_dry_run_prints_short_commands_that_read_their_config_from_a_file(tmp_path):
    done = run_snakemake(tmp_path, "-n", "-p", *SMOKE, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    commands = shell_commands(done.stdout)
    assert len(commands) >= 27, "a command per job"  # the smoke preset plans 28 jobs, `all` has none
    assert not any("--config-json" in c or '{"' in c for c in commands), "no config inline"
    # Each command is its stage, its files and its options; the report's lists every evaluation's
    # files (a few per model and benchmark), as Snakemake's own input: line of that job does.
    lengths = {c[:60]: len(c) for c in commands if "-m agentrl report" not in c}
    assert max(lengths.values()) < 600, max(lengths.items(), key=lambda item: item[1])
    configs = {_config_path(c) for c in commands if " --config " in c}
    assert {Path(path).name.rsplit("-", 1)[0] for path in configs} >= {"prepare_data", "sft", "grpo", "evaluate"}
    grpo = next(c for c in commands if "-m agentrl grpo " in c)
    assert (
        stage_config(grpo, tmp_path)["grpo"]["max_steps"]
        == yaml.safe_load((ROOT / "presets" / "smoke.yaml").read_text())["grpo"]["max_steps"]
    )
    for path in configs:  # named by their content: one run's files are never rewritten by another's plan
        assert path.startswith("results/smoke/config/")
        digest = hashlib.sha256((tmp_path / path).read_bytes()).hexdigest()[:12]
        assert path.endswith(f"-{digest}.json"), path

    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("grpo: {lr: 5.0e-5}\n")
    changed = run_snakemake(tmp_path, "-n", "-p", *SMOKE, str(overlay), timeout=180)
    assert changed.returncode == 0, changed.stderr[-3000:]
    new_grpo = next(c for c in shell_commands(changed.stdout) if "-m agentrl grpo " in c)
    assert _config_path(new_grpo) != _config_path(grpo), "another config, another file"
    assert stage_config(new_grpo, tmp_path)["grpo"]["lr"] == 5e-5
    assert stage_config(grpo, tmp_path)["grpo"]["lr"] != 5e-5, "the first plan's file is as it was"


@pytest.mark.slow
def test_a_failed_job_says_why_on_the_console_and_the_run_ends_with_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the same failure with or without a network
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(FAILING)
    workdir = tmp_path / "run"
    workdir.mkdir()
    done = run_snakemake(workdir, "--configfile", str(ROOT / "config.yaml"), str(overlay), "--until", "released_sft")
    assert done.returncode != 0
    console = done.stdout + done.stderr
    # the job itself, as it fails, then the run's last lines: the stage's error both times
    assert console.count(REASON) == 2, console[-4000:]
    assert "=== the job failed (exit 2); its log: results/logs/released_sft.log ===" in console
    end = console[console.index("The run stopped") :]
    assert end.startswith("The run stopped: 1 job failed.\nreleased_sft:\n    " + REASON), end[:1000]
    assert "its log: results/logs/released_sft.log (every attempt: results/logs/released_sft.attempts.log)" in end
    # the shell functions are sourced, not printed with the command of the failed job
    assert "keep_log()" not in console and "/rules/job_log.sh; " in console
    assert REASON in (workdir / "results" / "logs" / "released_sft.log").read_text()


# Two steps and a report, with the workflow's own common.smk and console.smk, and the end-of-run
# handlers as workflow/Snakefile has them.
HANDLERS = SNAKEFILE.read_text().split("\nonsuccess:", 1)[1].split("\nrule all:", 1)[0]
RULES = (
    "\nonsuccess:"
    + HANDLERS
    + """
rule report:
    input:
        result("data.txt"),
    output:
        result("report/summary.md"),
    shell:
        "cp {input} {output}"


rule data:
    output:
        result("data.txt"),
    shell:
        "date +%N > {output}"  # another content each time: what reads it runs again
"""
)


@pytest.mark.slow
def test_every_run_ends_with_where_its_report_is(tmp_path):
    (tmp_path / "Snakefile").write_text(rules_snakefile("console.smk", extra=RULES))
    options = {"snakefile": tmp_path / "Snakefile", "cores": 1}
    summary = "results/report/summary.md"
    partial = snakemake(tmp_path, "data", **options)
    advice = "the same command without --until or targets brings it up to date"
    assert f"Results under results/; the report ({summary}) is none yet: {advice}" in partial.stderr
    whole = snakemake(tmp_path, **options)
    assert f"The report: {summary}\n(every result under results/)" in whole.stderr, whole.stderr[-2000:]
    again = snakemake(tmp_path, "data", "--forcerun", "data", **options)
    assert f"the report ({summary}) is not built by this run: {advice}" in again.stderr, again.stderr[-2000:]
    rebuilt = snakemake(tmp_path, **options)
    assert f"The report: {summary}" in rebuilt.stderr, "the report ran again for its newer input"
