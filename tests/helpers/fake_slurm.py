"""A SLURM cluster on this machine for tests: its commands on PATH, its jobs real processes.

:func:`install` writes ``sbatch``, ``squeue``, ``sacct``, ``scontrol``, ``sinfo``, ``sacctmgr``,
``sshare``, ``scancel`` and ``srun`` into a folder; each runs this file with its own name. The
cluster's state is a folder (``FAKE_SLURM_DIR``): one JSON file per job under ``jobs/`` and
``sbatch.jsonl``, one line per sbatch call (its arguments).

What is real: ``sbatch`` starts a slurmd stand-in that runs the job's ``--wrap`` as the batch
script, in a session of its own, with SLURM's job variables (``SLURM_JOB_ID``,
``SLURM_JOB_END_TIME``, ...); at the job's time limit every process of that session gets SIGTERM,
then SIGKILL after KillWait, as slurmd signals every process of a job, and the job ends TIMEOUT;
``scancel`` does the same at once. ``srun`` runs its command as the step's one task with the
step's variables. ``squeue`` and ``sacct`` answer from the job files in the format asked for.
Only one node, and no resource is enforced.

Knobs, read by ``sbatch`` from its environment (that of snakemake):

- ``FAKE_SLURM_PREEMPT=rule[:n]``: the first n (1) submissions of the rule end PREEMPTED at once
  and never run, as on a ``PreemptMode=CANCEL`` partition;
- ``FAKE_SLURM_LIMIT_S=rule:seconds[,...]``: the time limit of the rule's first submission
  (later ones: their ``-t`` minutes);
- ``FAKE_SLURM_KILL_WAIT_S``: KillWait, seconds from SIGTERM to SIGKILL (5);
- ``FAKE_SLURM_RUN=0``: jobs stay PENDING, nothing runs (a test that expects no submission).
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "sinfo", "sacctmgr", "sshare", "scancel", "srun")
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")
# The cluster's account and partitions, which site_profile writes into a copy of profiles/slurm in
# place of its placeholders (a run with those is refused when the workflow loads)
PARTITIONS = ("cpu", "gpu")
ACCOUNT = "rl-lab"  # as sacctmgr lists it (lower case)
SITE_NAMES = {"YOUR_ACCOUNT": ACCOUNT, "YOUR_CPU_PARTITION": PARTITIONS[0], "YOUR_GPU_PARTITION": PARTITIONS[1]}
# sbatch options followed by a value as a separate word (the plugin writes ``-t 60``, ``--mem 16000``)
SBATCH_VALUES = {"-J", "--job-name", "-o", "--output", "--comment", "-A", "--account", "-p", "--partition",
                 "-t", "--time", "--mem", "--mem-per-cpu", "-D", "--chdir", "-C", "--constraint", "--qos"}  # fmt: skip
SRUN_VALUES = {"-n", "-N", "-c", "--nodes", "--ntasks", "--ntasks-per-node", "--gpus-per-node", "--cpus-per-task",
               "--mem", "--jobid", "-J", "--job-name"}  # fmt: skip


def install(bin_dir: Path, state: Path) -> dict[str, str]:
    """Write the commands into ``bin_dir``; the environment that puts them first on PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (state / "jobs").mkdir(parents=True, exist_ok=True)
    for name in COMMANDS:
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(__file__)} {name} "$@"\n')
        script.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_SLURM_DIR": str(state)}


def site_profile(folder: Path) -> Path:
    """profiles/slurm copied to ``folder`` with this cluster's account and partitions for its placeholders."""
    shutil.copytree(Path(__file__).resolve().parents[2] / "profiles" / "slurm", folder)
    for name in ("config.yaml", "partitions.yaml"):
        text = (folder / name).read_text()
        for placeholder, value in SITE_NAMES.items():
            text = text.replace(placeholder, value)
        (folder / name).write_text(text)
    return folder


def _state() -> Path:
    return Path(os.environ["FAKE_SLURM_DIR"])


def read_job(job_id: str, state: Path | None = None) -> dict:
    return json.loads(((state or _state()) / "jobs" / f"{job_id}.json").read_text())


def jobs(state: Path | None = None) -> list[dict]:
    """Every job the cluster knows, oldest first."""
    files = sorted(((state or _state()) / "jobs").glob("*.json"), key=lambda p: int(p.stem))
    return [json.loads(path.read_text()) for path in files]


def sbatch_calls(state: Path) -> list[list[str]]:
    """The arguments of every sbatch call, in order."""
    calls = state / "sbatch.jsonl"
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def write_job(job: dict, state: Path | None = None) -> None:
    """Write a job's file (atomically: readers never see half of it)."""
    folder = (state or _state()) / "jobs"
    tmp = folder / f".{job['id']}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(job))
    tmp.rename(folder / f"{job['id']}.json")


def add_job(state: Path, *, state_name: str, workdir: str, comment: str, name: str = "earlier-run") -> str:
    """A job of an earlier run that squeue lists (no process behind it); its id."""
    job_id = _next_id(state)
    write_job({"id": job_id, "name": name, "comment": comment, "workdir": workdir, "state": state_name,
               "end_limit": time.time() + 3600, "exit_code": 0}, state)  # fmt: skip
    return job_id


def _next_id(state: Path) -> str:
    with open(state / "next_id.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        counter = state / "next_id"
        job_id = int(counter.read_text()) if counter.exists() else 4001
        counter.write_text(str(job_id + 1))
    return str(job_id)


def _options(argv: list[str], with_values: set[str]) -> tuple[dict[str, str], list[str]]:
    """``--key=value``, ``--key value`` (keys in ``with_values``) and flags, up to the first word
    that is not an option; that word and the rest."""
    options: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        key, eq, value = argv[i].partition("=")
        if not eq and key in with_values:
            i, value = i + 1, argv[i + 1]
        elif not eq and len(key) > 2 and not key.startswith("--") and key[:2] in with_values:
            key, value = key[:2], key[2:]  # -n1
        options[key] = value
        i += 1
    return options, argv[i:]


def _per_rule(setting: str, rule: str) -> str | None:
    for item in filter(None, os.environ.get(setting, "").split(",")):
        name, _, value = item.partition(":")
        if name == rule:
            return value or "1"
    return None


def sbatch(argv: list[str]) -> int:
    state = _state()
    with open(state / "sbatch.jsonl", "a") as calls:
        calls.write(json.dumps(argv) + "\n")
    options, _ = _options(argv, SBATCH_VALUES)
    comment = options.get("--comment", "")
    rule = comment.removeprefix("rule_").split("_wildcards_")[0]
    earlier = sum(
        1 for job in jobs(state) if job.get("comment", "").removeprefix("rule_").split("_wildcards_")[0] == rule
    )
    limit = _per_rule("FAKE_SLURM_LIMIT_S", rule) if earlier == 0 else None
    minutes = options.get("-t") or options.get("--time") or "60"
    job = {
        "id": _next_id(state),
        "name": options.get("--job-name") or options.get("-J", ""),
        "comment": comment,
        "workdir": options.get("-D") or options.get("--chdir") or os.getcwd(),
        "output": options.get("--output") or options.get("-o") or "slurm-%j.out",
        "wrap": options.get("--wrap", ""),
        "limit_s": float(limit) if limit else 60.0 * float(minutes),
        "state": "PENDING",
        "end_limit": None,
        "exit_code": 0,
    }
    preempted = _per_rule("FAKE_SLURM_PREEMPT", rule)
    if preempted and earlier < int(preempted):
        job.update(state="PREEMPTED", end_limit=time.time())
        write_job(job)
    elif os.environ.get("FAKE_SLURM_RUN") == "0":
        write_job(job)
    else:
        write_job(job)
        subprocess.Popen(
            [sys.executable, __file__, "slurmd", job["id"]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    print(job["id"])
    return 0


def _session_processes(session: int) -> list[int]:
    """Every process of a session (a job's processes: what slurmd's cgroup holds)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _signal_job(session: int, signum: int) -> None:
    for pid in _session_processes(session):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _end_job(job: dict, process: subprocess.Popen, state_name: str) -> None:
    """SIGTERM to every process of the job, SIGKILL after KillWait, as slurmd ends a job."""
    job.update(state=state_name)
    write_job(job)
    _signal_job(process.pid, signal.SIGTERM)
    deadline = time.time() + float(os.environ.get("FAKE_SLURM_KILL_WAIT_S", "5"))
    while time.time() < deadline and _session_processes(process.pid):
        time.sleep(0.2)
    _signal_job(process.pid, signal.SIGKILL)
    process.wait()


def slurmd(job_id: str) -> int:
    job = read_job(job_id)
    start = time.time()
    job.update(state="RUNNING", start=start, end_limit=start + job["limit_s"])
    env = {
        key: value for key, value in os.environ.items() if not key.startswith("FAKE_SLURM_") or key == "FAKE_SLURM_DIR"
    }
    env.update({"SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_JOB_NAME": job["name"],
                "SLURM_SUBMIT_DIR": job["workdir"], "SLURM_JOB_END_TIME": str(int(job["end_limit"])),
                "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "localhost",
                "SLURM_NODELIST": "localhost", "SLURM_NTASKS": "1"})  # fmt: skip
    log = Path(job["workdir"]) / job["output"].replace("%j", job_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        process = subprocess.Popen(["/bin/bash", "-c", job["wrap"]], cwd=job["workdir"], env=env, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    job["session"] = process.pid
    write_job(job)
    while process.poll() is None:
        if read_job(job_id)["state"] == "CANCELLED":
            _end_job(job, process, "CANCELLED")
            return 0
        if time.time() >= job["end_limit"]:
            _end_job(job, process, "TIMEOUT")
            return 0
        time.sleep(0.2)
    _signal_job(process.pid, signal.SIGKILL)  # what the batch script left behind ends with the job
    job.update(state="COMPLETED" if process.returncode == 0 else "FAILED", exit_code=process.returncode)
    write_job(job)
    return 0


def _field(job: dict, code: str) -> str:
    end = job.get("end_limit")
    return {
        "i": job["id"],
        "T": job["state"],
        "Z": job.get("workdir", ""),
        "j": job.get("name", ""),
        "k": job.get("comment", ""),
        "e": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end)) if end else "N/A",
    }[code]


def squeue(argv: list[str]) -> int:
    options, _ = _options(argv, {"-o", "--format", "--name", "-j", "--jobs", "-t", "--states", "-u", "--user"})
    fmt = options.get("--format") or options.get("-o") or "%i %T"
    wanted = options.get("--jobs") or options.get("-j")
    ids = set(wanted.split(",")) if wanted else None
    everything = (options.get("--states") or options.get("-t", "")).lower() == "all" or ids is not None
    for job in jobs():
        if job.get("purged") or (ids is not None and job["id"] not in ids):
            continue  # purged: past MinJobAge, squeue forgot it (sacct has it)
        if "--name" in options and job.get("name") != options["--name"]:
            continue
        if not everything and job["state"] not in ACTIVE:
            continue
        line, i = "", 0
        while i < len(fmt):
            if fmt[i] == "%" and i + 1 < len(fmt):
                line, i = line + _field(job, fmt[i + 1]), i + 2
            else:
                line, i = line + fmt[i], i + 1
        print(line)
    return 0


def sacct(argv: list[str]) -> int:
    options, _ = _options(argv, {"-o", "--format", "--name", "-j", "--jobs", "-u", "--user", "--starttime",
                                 "--endtime", "-S", "-E", "--clusters", "-M"})  # fmt: skip
    fields = [
        f.split("%")[0].lower() for f in (options.get("--format") or options.get("-o") or "JobID,State").split(",")
    ]
    wanted = options.get("--jobs") or options.get("-j")
    delimiter = "|" if "--parsable2" in options or "-P" in options else " "
    for job in jobs():
        if wanted is not None and job["id"] not in wanted.split(","):
            continue  # a step (<id>.<n>) has no record here: nothing printed, as for a step that never ran
        if "--name" in options and job.get("name") != options["--name"]:
            continue
        values = {"jobid": job["id"], "jobidraw": job["id"], "state": job["state"], "account": ACCOUNT,
                  "exitcode": f"{job.get('exit_code', 0)}:0", "reason": "None", "nodelist": "localhost"}  # fmt: skip
        print(delimiter.join(values.get(name, "") for name in fields))
    return 0


def scontrol(argv: list[str]) -> int:
    if argv[:2] == ["show", "config"]:
        print("MaxArraySize            = 1001\nMinJobAge               = 300 sec")
    elif argv[:2] == ["show", "partition"]:
        for name in PARTITIONS:
            print(f"PartitionName={name} MaxTime=1-00:00:00 PreemptMode=OFF State=UP")
    return 0


def scancel(argv: list[str]) -> int:
    for job_id in (arg for arg in argv if arg.isdigit()):
        job = read_job(job_id)
        if job["state"] in ACTIVE:
            job["state"] = "CANCELLED"  # the slurmd stand-in signals its processes
            write_job(job)
    return 0


def srun(argv: list[str]) -> int:
    """The step's one task: the command, with the step's variables (one task on one node)."""
    _, command = _options(argv, SRUN_VALUES)
    env = {**os.environ, "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_STEP_NUM_TASKS": "1",
           "SLURM_STEP_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
           "SLURM_NTASKS": "1", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "localhost"}  # fmt: skip
    os.execvpe(command[0], command, env)


def main(name: str, argv: list[str]) -> int:
    if name == "slurmd":
        return slurmd(argv[0])
    if name == "sinfo":
        print("\n".join([PARTITIONS[0] + "*", *PARTITIONS[1:]]))
        return 0
    if name in ("sacctmgr", "sshare"):
        print(ACCOUNT)
        return 0
    return {"sbatch": sbatch, "squeue": squeue, "sacct": sacct, "scontrol": scontrol, "scancel": scancel,
            "srun": srun}[name](argv)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
