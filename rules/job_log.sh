# The shell functions every rule's command ends with, `... 2>&1 | keep_log {log} || show_error {log}`;
# rules/common.smk sources this file in the prefix of every job's shell (bash).

# keep_log LOG: the command's output goes to the rule's log and is appended, under a line naming
# the attempt, to <log name>.attempts.log beside it (the log's first line names that file).
# Snakemake deletes a job's log before each attempt, so a retry (retries, a resubmission after a
# timeout or preemption) would erase the failed attempt's log; the attempts file is no output or
# log of any rule, and is written as the job runs (a job killed by SLURM keeps what it wrote). The
# shell's pipefail keeps the command's exit status. The copy ignores the stop signals: SLURM sends
# SIGTERM to every process of a job before preemption and at the time limit, and the training
# stages then finish their step and log their checkpoint.
keep_log() {
    trap '' TERM USR1 USR2 INT HUP
    local attempts
    attempts="$(dirname "$1")/$(basename "$1" .log).attempts.log"
    echo "=== attempt started $(date -u "+%F %T UTC") on $(hostname) (SLURM job ${SLURM_JOB_ID:-none}); this attempt: $1, every attempt: $attempts ===" | tee "$1" >> "$attempts"
    tee -a "$1" >> "$attempts"
}

# show_error LOG, after `||`: a failed job says why on its stderr, which a local run prints on
# Snakemake's console (a SLURM job's goes to its SLURM log; the run's end says it either way,
# rules/console.smk, whose failure_reason reads a log by the same rule): the stage's own error,
# from its last "agentrl <stage>: " line on (a refused input or a stop, agentrl.__main__), else the
# log's last 5 lines (a traceback's exception, a killed process), where --show-failed-logs would
# print the whole log. It returns the job's exit status (75, a requeue, stays 75).
show_error() {
    local status=$?
    {
        echo "=== the job failed (exit $status); its log: $1 ==="
        tail -n 200 "$1" | awk '
            /^agentrl [a-z-]+: / { n = 0; found = 1 }
            { line[n++] = $0 }
            END { s = (found || n < 5) ? 0 : n - 5; for (i = s; i < n && i < s + 10; i++) print "  " line[i] }
        ' || true
    } >&2
    return $status
}
