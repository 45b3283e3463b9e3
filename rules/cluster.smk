# What a run asks of the cluster it submits to, checked when the workflow loads (before any job):
# the executor, the nodes of each job, the GPU count, and jobs of an earlier run still queued.
# Path helpers and the other load-time checks are in rules/common.smk, included before this file.
import contextlib
import io
import os
import re
import time

import yaml

from agentrl.training.folder_lock import LOCK_DIR_SETTING
from agentrl.training.slurm_jobs import (
    RUNNING_JOBS_SETTING,
    SQUEUE,
    jobs_of_this_run,
    lock_holders,
    parse_squeue,
    refusal,
)

# The rules whose stage starts one torchrun per node (agentrl.training.launch); the workflow
# profile gives them several nodes with AGENTRL_NODES=RULE:N.
MULTI_NODE_RULES = ("sft", "grpo", "ablation_sft", "ablation_grpo")
NODES_SETTING = "AGENTRL_NODES"  # read by the workflow profile, workflow/profiles/default
# What Snakemake's command line asks for instead of running jobs (snakemake.cli.args_to_api's
# branches before execute_workflow): none of them submits, so none is refused by the checks of
# a submission (an --unlock after a dead controller must work while its jobs are still queued).
MAINTENANCE = (
    "lint", "list_target_rules", "list_rules", "print_compilation", "generate_unit_tests", "containerize", "dag",
    "rulegraph", "filegraph", "d3dag", "unlock", "cleanup_metadata", "conda_cleanup_envs", "conda_create_envs_only",
    "list_conda_envs", "cleanup_shadow", "container_cleanup_images", "list_changes", "list_input_changes",
    "list_params_changes", "list_untracked", "summary", "detailed_summary", "archive", "delete_all_output",
    "delete_temp_output", "touch",
)  # fmt: skip


def run_mode(args):
    """``"maintenance"`` (nothing runs: --unlock, --summary, --dag, ...), ``"dry run"`` (-n) or ``"run"``."""
    if any(getattr(args, name, None) not in (None, False) for name in MAINTENANCE):
        return "maintenance"
    if (getattr(args, "report", None) or getattr(args, "reporter", None)) and not getattr(args, "report_after_run", False):
        return "maintenance"
    return "dry run" if getattr(args, "dryrun", False) else "run"


def site_executor():
    """The executor plugin this run submits with (``"slurm"``; None: the local one), what the command
    does (:func:`run_mode`), the SLURM plugin's partition file and the site profile's folder (None:
    no --profile), read from the command line and profiles as Snakemake's own parser reads them.

    Snakemake loads the Snakefile before it picks its executor (``workflow.executor_plugin`` is
    still None here, and a dry run swaps in the dry-run executor anyway), so the site profile's
    ``executor:`` is known only from the arguments. Run through Snakemake's Python API instead of
    its command line, nothing is known: (None, "run", None, None), as for a local run.
    """
    import snakemake.cli

    try:
        # in the folder snakemake was started in: a relative --profile is read from there, and with
        # --directory the workflow already runs elsewhere
        with contextlib.redirect_stderr(io.StringIO()), contextlib.chdir(workflow.rundir):
            _, args = snakemake.cli.parse_args(sys.argv[1:])
    except (SystemExit, Exception):  # not Snakemake's command line
        return None, "run", None, None
    partitions = getattr(args, "slurm_partition_config", None)  # the plugin's --slurm-partition-config
    profile = (getattr(args, "profile", None) or [None])[0]
    return getattr(args, "executor", None), run_mode(args), partitions, profile


EXECUTOR, RUN_MODE, PARTITION_FILE, PROFILE = site_executor() if workflow.is_main_process else (None, "run", None, None)
DRY_RUN = RUN_MODE == "dry run"
# The checks below are those of a submission: skipped when nothing is planned to run, and only
# warnings in a dry run where they are about the cluster's state rather than the plan.
SUBMITS = workflow.is_main_process and RUN_MODE != "maintenance"


def _rule_nodes(each):
    """A rule's constant node count, under any name the SLURM plugins read."""
    resources = _rule_resources(each)  # rules/common.smk: with --default-resources
    for key in ("nodes", "node", "slurm_nodes"):
        if isinstance(resources.get(key), int):
            return key, resources[key]
    return "nodes", 1


def check_nodes():
    """Refuse, when the workflow loads, node counts no job could run with.

    Several nodes are for the training rules under the SLURM executor, with the ``mpi`` resource
    the workflow profile adds for AGENTRL_NODES: only then does the job-step plugin run the command
    in the batch step, from where srun starts a torchrun on each node (a job without it runs inside
    ``srun -n1``, which holds the job's GPUs: the per-node srun could not start). Their GPUs are
    asked per node (``gres: gpu:N``, which SLURM reads per node), not by ``gpu``: the plugin submits
    that as ``--gpus``, a count for the whole job that SLURM may place unevenly (6 + 2 of 8), where
    each node's step asks for N. Checked by the controller only: a job's own snakemake (the job
    step, which reads this file too) knows no executor here.
    """
    if not workflow.is_main_process:
        return
    for each in workflow.rules:
        key, nodes = _rule_nodes(each)
        if nodes <= 1:
            continue
        where = f"resources {key}={nodes} in the {each.name} rule"
        if EXECUTOR != "slurm":
            raise WorkflowError(
                f"{where}: this run has no SLURM executor (profiles/local, or none), and runs every job on this "
                "one machine. Several nodes need the SLURM profile (--profile profiles/slurm with "
                f"{NODES_SETTING}={each.name}:{nodes}); here use nodes: 1"
            )
        if each.name not in MULTI_NODE_RULES:
            raise WorkflowError(
                f"{where}: only the training rules ({', '.join(MULTI_NODE_RULES)}) run on several nodes; "
                "every other job is one process. Leave it at nodes: 1"
            )
        resources = _rule_resources(each)
        if "mpi" not in each.resources.keys():  # a text value is an expression evaluated per job: not in resources
            raise WorkflowError(
                f"{where} without the mpi resource: the SLURM job-step plugin would run its command inside a one-task "
                "srun step holding the GPUs, where no per-node srun can start. Ask with "
                f"{NODES_SETTING}={each.name}:{nodes} instead (the workflow profile adds mpi, tasks and the GPUs of every "
                "node; --set-resources on the command line replaces every rule's entry of the workflow profile)"
            )
        if resources.get("gpu_model"):
            raise WorkflowError(
                f"{where} with gpu_model={resources['gpu_model']}: the SLURM plugin adds --gpus=<model>:<gpu> beside the "
                "per-node gres of a job of several nodes. Choose the GPU type by a constraint instead (resources "
                "constraint, sbatch -C)"
            )
        gpus = resources.get("gpu", 0)
        if gpus:
            raise WorkflowError(
                f"{where} with gpu={gpus}: the SLURM plugin submits gpu as --gpus={gpus}, GPUs of the whole job, which "
                f"SLURM may place unevenly over the nodes, while each node starts the same number of processes. Ask "
                f"per node: gres: gpu:N and no gpu, as the workflow profile does for {NODES_SETTING}={each.name}:{nodes}"
            )


def check_gpu_count():
    """Refuse a SLURM run whose GPU stages would ask for no GPU.

    The workflow profile sizes every GPU rule from AGENTRL_GPUS_PER_NODE; unset, it sets nothing,
    and under SLURM there is no GPU pool for check_gpu_requests (rules/common.smk) to compare with:
    sft, grpo, scoring and evaluation would go to a CPU partition and fail or retry there. An
    explicit 0 is a CPU run and allowed. Set, but asked for by none of the rules: --set-resources on
    the command line replaced the workflow profile's per-rule resources.
    """
    if EXECUTOR != "slurm":
        return
    given = os.environ.get(GPU_SETTING, "").strip()
    if not given:
        message = (
            f"{GPU_SETTING} is not set: under the SLURM executor the GPU stages (sft, grpo, scoring, evaluation) would "
            f"ask for no GPU and run on CPU nodes. Set {GPU_SETTING}=8 (the GPUs of one of your nodes), or "
            f"{GPU_SETTING}=0 for a run on CPUs only"
        )
        if DRY_RUN:  # the plan is shown as it is; the run itself is refused
            logger.warning(message)
            return
        raise WorkflowError(message)
    asking = [each.name for each in workflow.rules if (node_gpus(_rule_resources(each))[0] or 0) > 0]
    if given != "0" and not asking:
        raise WorkflowError(
            f"{GPU_SETTING}={given}, but none of the rules asks for a GPU. --set-resources on the command line replaced the "
            "workflow profile's per-rule resources (workflow/profiles/default). Drop it (AGENTRL_NODES for nodes), or "
            "copy that profile, edit it and pass it with --workflow-profile"
        )


# The template values of profiles/slurm, which a site replaces with its own account and partitions.
PLACEHOLDER = re.compile(r"YOUR_[A-Z_]+")


def _placeholders_in_resources(profile_file):
    """(where, value) of each SLURM account or partition given as a template value: the site
    profile's default-resources, or one rule's resources (set-resources)."""
    found = []
    defaults = workflow.resource_settings._parsed_default_resources or {}
    for key in ("slurm_account", "slurm_partition"):
        default = str(getattr(defaults.get(key), "raw", defaults.get(key)))
        if PLACEHOLDER.fullmatch(default):
            found.append((f"{profile_file}: default-resources: {key}", default))
        for each in workflow.rules:  # a rule's resources hold the defaults too
            value = str(getattr(each.resources.get(key), "raw", each.resources.get(key)))
            if PLACEHOLDER.fullmatch(value) and value != default:
                found.append((f"the {each.name} rule's resources (set-resources): {key}", value))
    return found


def check_placeholders():
    """Refuse a SLURM submission while the site profile still holds the template's account or
    partitions (``YOUR_ACCOUNT``, ``YOUR_GPU_PARTITION``; profiles/slurm): sbatch would reject every
    job for its account, or the plugin would find no partition of the cluster by those names. Each
    is named with its key and the file to edit; a dry run only warns, after which it plans as given."""
    if EXECUTOR != "slurm":
        return
    profile_file = f"{PROFILE}/config.yaml" if PROFILE else "--default-resources"
    accounts = "your accounts: sacctmgr -n show associations user=$USER format=account"
    problems = [f"{where}: {value!r} ({accounts})" for where, value in _placeholders_in_resources(profile_file)]
    if PARTITION_FILE:
        try:
            text = Path(workflow.rundir, PARTITION_FILE).read_text()  # relative to where snakemake started
            names = list((yaml.safe_load(text) or {}).get("partitions") or {})
        except (OSError, yaml.YAMLError, AttributeError):
            names = []  # the plugin reports a file it cannot read
        template = [name for name in names if PLACEHOLDER.fullmatch(str(name))]
        if template:
            problems.append(
                f"{PARTITION_FILE} (slurm-partition-config): partitions: {', '.join(template)} (your partitions: sinfo -s; "
                "their limits: scontrol show partition NAME)"
            )
    if not problems:
        return
    message = "the SLURM site profile still holds the template's placeholders; set your cluster's:\n" + "\n".join(
        f"  - {problem}" for problem in problems
    )
    if DRY_RUN:  # the plan is shown as it is; the run itself is refused
        logger.warning(f"{message}\nThis dry run plans with them; a run is refused until they are set.")
        return
    raise WorkflowError(message)


def check_conda():
    """Refuse a run or dry run with conda among its software deployment methods (--sdm conda) where
    no ``conda`` command is on PATH: Snakemake would stop while it builds the DAG with "Error
    running conda info", which says neither what is missing nor the way without conda."""
    import shutil

    from snakemake.settings.types import DeploymentMethod

    if DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method or shutil.which("conda"):
        return
    raise WorkflowError(
        "--sdm conda (software-deployment-method: conda) builds each rule's environment from envs/*.yaml with "
        "conda, and there is no conda command on PATH here. Install conda (Miniforge, "
        "https://conda-forge.org/download; Snakemake 9 runs conda itself, mamba alone does not do) and put it "
        "on PATH (conda activate base, on this host and on the compute nodes), or run without --sdm conda with "
        "the stages' packages installed in this environment (pip install -e '.[vllm-cuda]' on a GPU machine; "
        'on a SLURM cluster snakemake and CUDA vLLM need separate environments: docs/paper-scale.md, "Installing")'
    )


RUNNING_JOBS_POLL_S = 60


def _running_jobs():
    """This results folder's jobs squeue still lists ([] when squeue cannot say), and their locks."""
    import shutil
    import subprocess

    if shutil.which(SQUEUE[0]) is None:
        logger.warning("squeue is not on PATH: cannot look for jobs of an earlier run still running")
        return [], {}
    done = subprocess.run(SQUEUE, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        logger.warning(f"squeue failed ({done.stderr.strip()[:200]}): cannot look for jobs of an earlier run")
        return [], {}
    holders = lock_holders(Path(RESULTS), os.environ.get(LOCK_DIR_SETTING))
    rules = [each.name for each in workflow.rules]
    return jobs_of_this_run(parse_squeue(done.stdout), workflow.workdir_init, rules, holders), holders


def check_running_jobs():
    """Refuse to submit while jobs of an earlier run on this results folder are queued or running.

    A dead controller leaves its SLURM jobs running (agentrl.training.slurm_jobs says how they are
    found); submitting their jobs again would start a second trainer on a locked folder, retried
    until the attempts run out. AGENTRL_RUNNING_JOBS=wait waits for them to end, polling squeue;
    =ignore goes on (another results folder's run from this directory). A dry run only warns.
    """
    if EXECUTOR != "slurm":
        return
    mode = os.environ.get(RUNNING_JOBS_SETTING, "").strip()
    if mode not in ("", "wait", "ignore"):
        raise WorkflowError(f"{RUNNING_JOBS_SETTING}={mode!r}: unset (refuse), wait or ignore")
    if mode == "ignore":
        return
    said = False
    while True:
        found, holders = _running_jobs()
        if not found:
            return
        message = refusal(found, str(Path(RESULTS).resolve()), holders)
        if DRY_RUN:
            logger.warning(message)
            return
        if mode != "wait":
            raise WorkflowError(message)
        if not said:
            logger.warning(f"{RUNNING_JOBS_SETTING}=wait: waiting for {' '.join(job.job_id for job in found)} to end")
            said = True
        time.sleep(RUNNING_JOBS_POLL_S)


def check_plugins():
    """Refuse a SLURM run whose installed SLURM plugins are not those the workflow is written
    against (agentrl.training.slurm_jobs.PLUGINS, the pins of pyproject.toml's slurm extra): the
    several-node launch relies on the job-step plugin's run_job, which runs every job of the run on
    the compute nodes from this same environment. A dry run only warns."""
    from importlib.metadata import version

    from agentrl.training.slurm_jobs import PLUGINS, plugin_problems

    if EXECUTOR != "slurm":
        return
    problems = plugin_problems(version)
    if not problems:
        return
    pins = " ".join(f"'{name}{kind}{wanted}'" for name, (kind, wanted) in PLUGINS.items())
    message = f"{'; '.join(problems)}: pip install {pins} (pip install -e '.[slurm]' installs them)"
    if DRY_RUN:
        logger.warning(message)
        return
    raise WorkflowError(message)


def _command_line():
    """The command that continues this run: its settings from the environment, then snakemake's arguments."""
    import shlex

    settings = [f"{key}={shlex.quote(os.environ[key])}" for key in (GPU_SETTING, NODES_SETTING) if key in os.environ]
    return " ".join([*settings, "snakemake", shlex.join(sys.argv[1:])])


def watch_preemptions():
    """Fail, within two status checks, a submitted job that was preempted for good, so that the
    run's retries submit it again (a training job resumes from its checkpoint, a shard job from
    its finished problems) instead of the run waiting for it for ever.

    snakemake-executor-plugin-slurm 2.8 takes PREEMPTED for still running: after one warning
    ("A Job preemption occured!") its Executor.check_active_jobs keeps such a job active. Where
    SLURM requeues preempted jobs (PreemptMode=REQUEUE) that is right; where it cancels them
    (PreemptMode=CANCEL, of a partition or of a QOS) the job never comes back. So the plugin's check
    is wrapped: agentrl.training.slurm_jobs.PreemptionWatch asks squeue (and sacct for jobs squeue
    no longer lists) first, and a job preempted for good on two checks in a row is reported failed
    with one line naming it, its state and the command that continues the run. Only in the
    controller of a run: nothing is polled in a dry run or a job step.
    """
    if EXECUTOR != "slurm" or RUN_MODE != "run":
        return
    import snakemake_executor_plugin_slurm as plugin
    from agentrl.training.slurm_jobs import PreemptionWatch, preemption_message

    plugin_check = plugin.Executor.check_active_jobs
    if getattr(plugin_check, "watches_preemption", False):
        return
    watch, command = PreemptionWatch(), _command_line()

    async def check_active_jobs(self, active_jobs):
        gone = watch.gone(job.external_jobid for job in active_jobs)
        for job in active_jobs:
            if job.external_jobid in gone:
                self.report_job_error(job, msg=preemption_message(job.external_jobid, job.job.name, command))
        async for job in plugin_check(self, [job for job in active_jobs if job.external_jobid not in gone]):
            yield job

    check_active_jobs.watches_preemption = True
    plugin.Executor.check_active_jobs = check_active_jobs


def _held_paths():
    """The lock targets a SLURM job of this run would take: each training rule's checkpoint folder
    (a constant ``checkpoints`` param, or one an earlier job locked) and each shard file with a lock."""
    folders = {Path(each.params.checkpoints) for each in workflow.rules if isinstance(each.params.get("checkpoints"), str)}
    folders |= {lock.parent for lock in Path(RESULTS).glob("**/trainer.lock")}
    shards = {lock.with_suffix("") for lock in Path(RESULTS).glob("**/*.jsonl.lock")}
    return sorted(folders), sorted(shards)


def check_results_locks():
    """Refuse to submit when a job's lock in the results folder is held, or cannot be taken so that
    every node sees it, before any job waits in the queue for it.

    A training job takes its checkpoint folder's lock, a shard job its shard file's
    (agentrl.training.folder_lock), and refuses at its start when it cannot: held by another
    process (a trainer started by hand, an orphan that still stops), or a file system whose flock
    fails or locks on one node only. Under SLURM that refusal came after the job's wait for GPUs,
    once per retry; here it comes in seconds. The controller takes each lock and lets it go at
    once, and checks the mount as a job on a compute node would (the node-local case is judged
    from the mount options this host sees: a client-side setting such as BeeGFS's tuneUseGlobalFileLocks
    is not among them, docs/operations.md). Locks held by an earlier run's SLURM jobs are
    check_running_jobs' (it may wait for them); a dry run does not take locks.
    """
    from agentrl.training.folder_lock import (
        LOCK_FILE,
        CheckpointFolderInUse,
        LocksUnsupported,
        ShardFileInUse,
        _refuse_node_local_locks,
        hold_checkpoint_folder,
        hold_shard_file,
        lock_file,
    )

    if EXECUTOR != "slurm" or DRY_RUN:
        return
    folders, shards = _held_paths()
    try:
        for folder in folders:
            _refuse_node_local_locks(lock_file(folder / LOCK_FILE, os.environ), {"SLURM_JOB_ID": "a job of this run"})
            with hold_checkpoint_folder(folder, "snakemake (its check before submitting)"):
                pass
        for shard in shards:
            with hold_shard_file(shard, "snakemake (its check before submitting)", wait_s=0.0):
                pass
    except (CheckpointFolderInUse, ShardFileInUse, LocksUnsupported) as error:
        raise WorkflowError(f"{error} (found before anything was submitted, so no job waits in the queue for it)")
