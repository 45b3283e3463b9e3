"""The SLURM jobs of a results folder that are still queued or running, found before a run submits.

Under SLURM a training or shard stage lives inside its job: when the ``snakemake`` that submitted
it dies (a closed login session, ``kill -9``, a node reboot), nothing reaches the job, which runs
on for up to its time limit. A new ``snakemake`` has a new run id, so it cannot see those jobs; it
resubmits the incomplete ones (``rerun-incomplete``), and each new job finds its folder locked
(:mod:`agentrl.training.folder_lock`) or, for a job without a lock, writes the same outputs.
The workflow therefore looks for them when it loads (``check_running_jobs`` in rules/cluster.smk)
and refuses to start with the ``scancel`` that ends them, unless told to wait for them.

Two ways a job is this results folder's:

- it holds a lock in the folder (a trainer's ``trainer.lock``, a shard's ``.lock``, or its file in
  ``AGENTRL_LOCK_DIR``): the holder wrote its SLURM job id there (exact, but only once it started);
- ``squeue`` lists it as the user's job submitted from this working directory (``%Z``) with the
  comment the SLURM executor plugin gives every job (``rule_<rule>[_wildcards_...]``) naming a rule
  of this workflow: also jobs still pending. Another results folder's run from the same directory
  looks the same; the message says so and how to go on (``AGENTRL_RUNNING_JOBS=ignore``).

During a run, the controller also watches its jobs for preemption that does not come back
(:class:`PreemptionWatch`, used by ``watch_preemptions`` in rules/cluster.smk): the SLURM executor
plugin would wait for such a job for ever.

Pure functions of the text ``squeue`` and ``sacct`` print and of the lock files; the watch runs
the two commands.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# %i job id, %T state, %Z working directory, %j name, %k comment (last: it is free text)
SQUEUE = ["squeue", "--me", "--noheader", "--format=%i|%T|%Z|%j|%k"]
RUNNING_JOBS_SETTING = "AGENTRL_RUNNING_JOBS"  # unset: refuse; wait; ignore
LOCK_GLOBS = ("**/trainer.lock", "**/*.jsonl.lock")


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    state: str
    workdir: str
    name: str
    comment: str

    @property
    def rule(self) -> str | None:
        """The rule the SLURM executor plugin named in the comment (``rule_<name>[_wildcards_...]``)."""
        if not self.comment.startswith("rule_"):
            return None
        return self.comment.removeprefix("rule_").split("_wildcards_")[0]


def parse_squeue(text: str) -> list[QueuedJob]:
    """The jobs of ``squeue --format=%i|%T|%Z|%j|%k`` output (:data:`SQUEUE`)."""
    jobs = []
    for line in text.splitlines():
        fields = line.strip().split("|", 4)
        if len(fields) == 5 and fields[0]:
            jobs.append(QueuedJob(*(field.strip() for field in fields)))
    return jobs


def lock_holders(results: Path, lock_dir: str | None = None) -> dict[str, str]:
    """SLURM job id -> the path it locks, for every lock holder of ``results`` that named its job.

    The holder's record stays in the file after it ended (the kernel drops only the lock), so these
    are candidates: ``squeue`` says which still run.
    """
    results = results.resolve()
    files: list[Path] = [path for pattern in LOCK_GLOBS for path in results.glob(pattern)]
    if lock_dir:
        files += [path for path in Path(lock_dir).glob("*") if path.is_file()]
    holders = {}
    for path in files:
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        locks = Path(info.get("locks") or path)
        if info.get("slurm_job") and (locks == results or results in locks.parents):
            holders[str(info["slurm_job"])] = str(locks)
    return holders


def jobs_of_this_run(
    queued: Iterable[QueuedJob], workdir: str, rules: Iterable[str], holders: Mapping[str, str]
) -> list[QueuedJob]:
    """The queued jobs that hold a lock in the results folder, or were submitted from ``workdir``
    for a rule of this workflow."""
    names = set(rules)
    return [
        job
        for job in queued
        if job.job_id in holders or (job.rule in names and job.workdir.rstrip("/") == workdir.rstrip("/"))
    ]


def refusal(found: list[QueuedJob], results: str, holders: Mapping[str, str]) -> str:
    """One line: the jobs, why they are in the way, the scancel and the two ways to go on."""
    listed = "; ".join(
        f"{job.job_id} ({job.rule or job.name}, {job.state}"
        + (f", holds {holders[job.job_id]}" if job.job_id in holders else "")
        + ")"
        for job in found
    )
    ids = " ".join(job.job_id for job in found)
    return (
        f"SLURM jobs of an earlier run on {results} are still queued or running: {listed}. A new run would "
        "submit their jobs again beside them (two trainers on one checkpoint folder are refused, every retry "
        f"too). Cancel them: scancel {ids}; or let them end first: {RUNNING_JOBS_SETTING}=wait; or, if they "
        f"are another results folder's run from this directory: {RUNNING_JOBS_SETTING}=ignore"
    )


def gres_gpus(gres: str) -> int | None:
    """The GPUs per node a ``gres`` resource asks for (``gpu:8``, ``gpu:h100:8``, among other gres
    separated by commas); None when it asks for none. SLURM reads ``--gres`` per node."""
    for item in gres.split(","):
        parts = item.strip().split(":")
        if parts[0] == "gpu" and len(parts) in (2, 3) and parts[-1].isdigit():
            return int(parts[-1])
    return None


# The SLURM plugins this workflow is written against (pyproject.toml's slurm extra): the job-step plugin's
# exact release (its run_job runs a job with an mpi resource in the batch step, which the multi-node
# launch needs, and strips the job's SLURM variables), and the executor plugin's 2.x from 2.8.
PLUGINS = {
    "snakemake-executor-plugin-slurm-jobstep": ("==", "0.6.1"),
    "snakemake-executor-plugin-slurm": (">=", "2.8"),
}


def plugin_problems(version) -> list[str]:
    """What is wrong with the installed SLURM plugins, one sentence each; ``version`` is
    :func:`importlib.metadata.version` (raises PackageNotFoundError for a package not installed)."""
    from importlib.metadata import PackageNotFoundError

    problems = []
    for name, (kind, wanted) in PLUGINS.items():
        try:
            found = version(name)
        except PackageNotFoundError:
            problems.append(f"{name} is not installed")
            continue
        numbers = tuple(int(part) for part in found.split(".")[:2] if part.isdigit())
        low = tuple(int(part) for part in wanted.split("."))
        fits = found == wanted if kind == "==" else numbers >= low and numbers[0] == low[0]
        if not fits:
            problems.append(f"{name} {found} is installed, the workflow is written against {kind}{wanted}")
    return problems


# Every job of the user that squeue still knows, finished ones included (MinJobAge), and its state
SQUEUE_STATES = ["squeue", "--me", "--states=all", "--noheader", "--format=%i|%T"]
SACCT_STATES = ["sacct", "-X", "--parsable2", "--noheader", "--format=JobIDRaw,State"]  # then -j <ids>


def parse_states(text: str) -> dict[str, str]:
    """Job id -> state, from ``<id>|<state>`` lines (:data:`SQUEUE_STATES`, :data:`SACCT_STATES`)."""
    states = {}
    for line in text.splitlines():
        job, _, state = line.strip().partition("|")
        if job and state:
            states[job] = state.split()[0]  # sacct writes "CANCELLED by <uid>"
    return states


def preempted_for_good(job_ids: Iterable[str], queued: Mapping[str, str], accounted: Mapping[str, str]) -> set[str]:
    """The jobs that were preempted and that SLURM will not run again.

    ``queued`` is squeue's state of each job it lists, ``accounted`` sacct's. A job preempted on a
    ``PreemptMode=CANCEL`` partition or QOS ends PREEMPTED: squeue lists it so until MinJobAge, then
    not at all, while sacct keeps saying PREEMPTED. A job SLURM requeues (``PreemptMode=REQUEUE``)
    is listed COMPLETING while its processes end, then PENDING, and runs again under its id.
    """
    gone = set()
    for job in job_ids:
        state = queued.get(job)
        if state == "PREEMPTED" or (state is None and accounted.get(job) == "PREEMPTED"):
            gone.add(job)
    return gone


class PreemptionWatch:
    """Finds the submitted jobs preempted for good, for the controller to fail them (a retry then
    submits them again) instead of waiting: snakemake-executor-plugin-slurm 2.8 takes PREEMPTED for
    still running (``Executor.check_active_jobs``), so the run would wait for such a job for ever.

    A job counts once :func:`preempted_for_good` says so on two checks in a row, so that a job SLURM
    is about to requeue is not failed in the moment between its preemption and its requeue.
    ``run`` runs a command (subprocess.run's signature); squeue or sacct failing finds nothing.
    """

    def __init__(self, run=subprocess.run) -> None:
        self._run = run
        self._suspects: set[str] = set()

    def _states(self, command: list[str]) -> dict[str, str] | None:
        try:
            done = self._run(command, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return parse_states(done.stdout) if done.returncode == 0 else None

    def gone(self, job_ids: Iterable[str]) -> set[str]:
        """Those of ``job_ids`` preempted for good on this check and the one before."""
        job_ids = set(job_ids)
        queued = self._states(SQUEUE_STATES)
        if queued is None:
            return set()
        unlisted = sorted(job for job in job_ids if job not in queued)
        accounted = (self._states([*SACCT_STATES, "-j", ",".join(unlisted)]) or {}) if unlisted else {}
        found = preempted_for_good(job_ids, queued, accounted)
        gone, self._suspects = found & self._suspects, found
        return gone


def preemption_message(job_id: str, rule: str, command: str) -> str:
    """One line: the job, its state, what snakemake does now and the command that continues the run."""
    return (
        f"SLURM job {job_id} ({rule}) was PREEMPTED and SLURM will not run it again (its partition or QOS "
        "preempts with PreemptMode=CANCEL): snakemake submits it anew while its retries last, and a training or "
        "shard job resumes from its checkpoint or finished problems. If the run stops here, continue it with: "
        f"{command}\n"  # Snakemake appends its own sentence to a job's error message
    )
