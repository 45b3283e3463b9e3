"""What snakemake-executor-plugin-slurm would submit for each job of a workflow: its own code, no copy.

``python tests/helpers/slurm_submissions.py TARGET SNAKEMAKE_ARGS...`` runs Snakemake's command
line as given (targets first, then profile and config files; ``--dag`` is added), but instead of
printing the DAG it hands every job to the plugin's own builders and prints one JSON object per job:

- ``sbatch``: ``get_submit_command`` + ``set_gres_string`` (what the plugin's ``Executor.run_job``
  concatenates) with the plugin's executor settings as the profiles give them (``slurm-requeue``),
  and the partition from ``Executor.get_partition_arg`` (a partition the rule names, or the one the
  plugin picks from ``slurm-partition-config``);
- ``srun``: the job step's settings from snakemake-executor-plugin-slurm-jobstep
  (``get_cpu_setting``, ``get_gpu_setting``, ``get_node_setting``), as its ``run_job`` builds the
  ``srun -n1`` call inside the allocation; None for a job with an ``mpi`` resource, whose command
  ``run_job`` runs in the batch step as it is (its ``"mpi" in job.resources.keys()`` branch);
- ``command``: the job's shell command with its params, resources and threads filled in;
- the job's rule, threads, resources and whether its rule is a local rule.

``--attempt N`` (taken out before Snakemake reads the rest) describes every job at its N-th attempt,
as Snakemake's scheduler retries a failed job: it sets ``job.attempt``, which re-evaluates the
job's resources.

Only what talks to a real cluster is left out: the account check (``sacctmgr``), so the account
string is passed through as written, and the submission itself.
"""

from __future__ import annotations

import json
import logging
import sys
from types import SimpleNamespace

import snakemake.cli
import snakemake.workflow
import snakemake_executor_plugin_slurm as slurm
import snakemake_executor_plugin_slurm_jobstep as jobstep
from snakemake.shell import shell as job_shell
from snakemake_executor_plugin_slurm.partitions import read_partition_file
from snakemake_executor_plugin_slurm.submit_string import get_submit_command
from snakemake_executor_plugin_slurm.utils import set_gres_string
from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

SETTINGS = None  # the SLURM plugin's executor settings, parsed from the command line and profiles
ATTEMPT = 1


def describe(job) -> dict:
    gpu_job = bool(job.resources.get("gpu")) or "gpu" in str(job.resources.get("gres", ""))
    partition_file = getattr(SETTINGS, "partition_config", None)
    partitions = read_partition_file(partition_file) if partition_file else None
    executor = SimpleNamespace(_partitions=partitions, _fallback_partition=None, logger=logging.getLogger("slurm"))
    chooses = job.resources.get("slurm_partition") or partitions
    params = {
        "run_uuid": "RUN",
        "slurm_logfile": f".snakemake/slurm_logs/rule_{job.name}/%j.log",
        "comment_str": f"rule_{job.name}",
        "account": f" -A {job.resources.get('slurm_account')}",
        # without a partition to name or choose, the plugin asks sinfo for the cluster's default: none here
        "partition": slurm.Executor.get_partition_arg(executor, job) if chooses else "",
        "workdir": None,
    }
    sbatch = get_submit_command(job, params, SETTINGS) + set_gres_string(job)
    mpi = "mpi" in job.resources.keys()
    step = [jobstep.get_cpu_setting(job, gpu_job), jobstep.get_gpu_setting(job), jobstep.get_node_setting(job)]
    srun = None if mpi else " ".join(step)
    resources = {k: v for k, v in job.resources.items() if isinstance(v, (int, str, float))}
    return {
        "rule": job.name,
        # a local rule runs on the submitting host (job.is_local is True for every job of --dag)
        "localrule": job.rule.name in job.dag.workflow._localrules or job.rule.norun,
        "threads": job.threads,
        "resources": resources,
        "mpi": mpi,
        "sbatch": sbatch,
        "srun": srun,
        # what the job runs and in which env (tests/test_envs.py checks the env has what it imports)
        "conda_env": str(job.rule.conda_env) if job.rule.conda_env else None,
        "shell": job.rule.shellcmd,
        "command": job.format_wildcards(job.rule.shellcmd) if job.rule.shellcmd else None,
        "shell_prefix": job_shell._process_prefix,  # what every job's command starts with
        "output": sorted(map(str, job.output)),
    }


def capture(self) -> None:
    """Replaces Workflow.printdag: build the DAG as --dag does, then describe its jobs."""
    self._prepare_dag(forceall=self.dag_settings.forceall, ignore_incomplete=True, lock_warn_only=True)
    self._build_dag()
    jobs = sorted(self.dag.jobs, key=lambda j: (j.name, str(j.wildcards)))
    for job in jobs:
        job.attempt = ATTEMPT
    print(json.dumps([describe(job) for job in jobs]))


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--attempt" in argv:
        at = argv.index("--attempt")
        ATTEMPT = int(argv[at + 1])
        del argv[at : at + 2]
    argv = [*argv, "--dag", "--quiet", "rules"]
    # the workflow reads its command line from sys.argv (rules/cluster.smk site_executor): a --dag,
    # which submits nothing, is not held to the checks of a submission (the profile's placeholders)
    sys.argv = [sys.argv[0], *argv]
    _, args = snakemake.cli.parse_args(argv)
    if args.executor == "slurm":  # as snakemake.cli.args_to_api reads them
        SETTINGS = ExecutorPluginRegistry().get_plugin("slurm").get_settings(args)
    snakemake.workflow.Workflow.printdag = capture
    snakemake.cli.main(argv)
