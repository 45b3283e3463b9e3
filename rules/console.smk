# What a run says at its end (workflow/Snakefile's onsuccess and onerror): where its results are,
# or which jobs failed and why, so that the last lines on the console are the ones to act on
# (Snakemake's own end is "Complete log(s)" and, for a failure, "At least one job did not complete
# successfully"). Only the controller of a run says it: a job's own snakemake (SLURM's job step)
# runs with --no-hooks, and a dry run calls neither handler.
import re

# The reports a run may build (by rule): the main one, and `snakemake ablations`' tables.
REPORTS = {"report": ("The report", result("report/summary.md")), "ablation_report": ("The ablation tables", ablation_result(""))}
FAILURE_LINES = 10  # at most this many lines of a stage's error


def failure_reason(log):
    """The stage's error in a job's log, as the jobs' own show_error finds it (rules/job_log.sh),
    from its last ``agentrl <stage>: `` line (the message of a refused input or a stop,
    agentrl.__main__) on, else the log's last 5 lines (a traceback's exception, a killed process)."""
    try:
        lines = Path(log).read_text(encoding="utf-8", errors="replace").splitlines()[-200:]
    except OSError as error:
        return [f"(its log cannot be read: {error.strerror})"]
    starts = [i for i, line in enumerate(lines) if re.match(r"agentrl [a-z-]+: ", line)]
    start = starts[-1] if starts else max(len(lines) - 5, 0)
    return lines[start : start + FAILURE_LINES]


def _jobs_run():
    """The jobs this run ran to their end."""
    dag = workflow.dag
    return [job for job in dag.needrun_jobs(exclude_finished=False) if dag.finished(job)]


def results_message():
    """Where the results are: the reports this run built, else the main one, which a run of the
    default target brings up to date with what this run wrote."""
    built = [REPORTS[job.rule.name] for job in _jobs_run() if job.rule.name in REPORTS]
    if built:
        return "\n".join(f"{label}: {path}" for label, path in built) + f"\n(every result under {RESULTS}/)"
    summary = REPORTS["report"][1]
    state = "not built by this run" if Path(summary).exists() else "none yet"
    return (
        f"Results under {RESULTS}/; the report ({summary}) is {state}: "
        "the same command without --until or targets brings it up to date"
    )


def failures_message():
    """Each failed job (after its retries) with the stage's error and its logs."""
    failed = sorted(getattr(workflow.scheduler, "failed", ()), key=lambda job: (job.rule.name, str(job.wildcards)))
    count = f"{len(failed)} job{'s' if len(failed) != 1 else ''} failed"
    lines = [f"The run stopped: {count}." if failed else "The run stopped."]
    for job in failed:
        wildcards = ", ".join(f"{key}={value}" for key, value in job.wildcards_dict.items())
        lines.append(f"{job.rule.name}{f' ({wildcards})' if wildcards else ''}:")
        for log in map(str, job.log):
            lines += [f"    {line}" for line in failure_reason(log)]
            attempts = Path(log).with_name(Path(log).stem + ".attempts.log")
            also = f" (every attempt: {attempts})" if attempts.exists() else ""
            lines.append(f"  its log: {log}{also}")
    lines.append("Fix what it says and run the same command again: the jobs that finished are not run again.")
    return "\n".join(lines)
