"""A retried job keeps the log of every attempt (rules/common.smk KEPT_LOG).

Snakemake deletes a job's ``log:`` file before each attempt; each rule therefore also appends its
output to ``<log name>.attempts.log``, under a line naming the attempt. The job here fetches a
released SFT model (``sft.from``) by a hub id that is in no cache, offline (``HF_HUB_OFFLINE=1``;
a local path that is missing or no model folder is refused when the workflow loads): it fails in
seconds and needs no other job, and ``--retries 1`` runs it twice, as a retry on a cluster would.
Its exit status reaches Snakemake through the pipe into the log copy (the prefix's pipefail).
"""

from __future__ import annotations

import pytest
from helpers.workflows import ROOT, run_snakemake


@pytest.mark.slow
def test_a_retried_failing_job_keeps_the_first_attempts_log(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the same failure with or without a network
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("sft: {from: nobody/no-such-model}\n")
    workdir = tmp_path / "run"
    workdir.mkdir()
    done = run_snakemake(
        workdir, "--retries", "1", "--configfile", str(ROOT / "config.yaml"), str(overlay), "--until", "released_sft"
    )
    assert done.returncode != 0, done.stdout[-2000:]
    out = done.stdout + done.stderr
    assert "Trying to restart job" in out
    # the stage's exit status reaches Snakemake through `| keep_log` (pipefail): a failed job,
    # not one that "completed successfully" with its outputs missing
    assert "non-zero exit status" in out and "MissingOutputException" not in out, out[-3000:]

    logs = workdir / "results" / "logs"
    attempts = (logs / "released_sft.attempts.log").read_text()
    headers = [line for line in attempts.splitlines() if line.startswith("=== attempt started")]
    assert len(headers) == 2, attempts[-3000:]
    error = "agentrl fetch-model: error: sft.from='nobody/no-such-model': not in the local hub cache"
    assert attempts.count(error) == 2, "each attempt's error is kept"
    # the rule's own log holds the last attempt and names the file with all of them
    last = (logs / "released_sft.log").read_text()
    assert last.splitlines()[0] == headers[1] and last.count(error) == 1
    assert "every attempt: results/logs/released_sft.attempts.log" in last.splitlines()[0]
