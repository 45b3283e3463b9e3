"""What snakemake-executor-plugin-slurm would submit for each job of a workflow: its own code, no copy.

``python tests/slurm_submissions.py TARGET SNAKEMAKE_ARGS...`` runs Snakemake's command line as
given (targets first, then profile and config files; ``--dag`` is added), but instead of printing the DAG it hands every job to
the plugin's own builders and prints one JSON object per job:

- ``sbatch``: ``get_submit_command`` + ``set_gres_string`` (what the plugin's ``Executor.run_job``
  concatenates), with the partition from ``Executor.get_partition_arg``;
- ``srun``: the job step's settings from snakemake-executor-plugin-slurm-jobstep
  (``get_cpu_setting``, ``get_gpu_setting``, ``get_node_setting``), as its ``run_job`` builds the
  ``srun -n1`` call inside the allocation;
- the job's rule, threads, resources and whether its rule is a local rule.

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
from snakemake_executor_plugin_slurm.submit_string import get_submit_command
from snakemake_executor_plugin_slurm.utils import set_gres_string


def describe(job) -> dict:
    gpu_job = bool(job.resources.get("gpu")) or "gpu" in str(job.resources.get("gres", ""))
    executor = SimpleNamespace(_partitions=None, _fallback_partition=None, logger=logging.getLogger("slurm"))
    params = {
        "run_uuid": "RUN",
        "slurm_logfile": f".snakemake/slurm_logs/rule_{job.name}/%j.log",
        "comment_str": f"rule_{job.name}",
        "account": f" -A {job.resources.get('slurm_account')}",
        # without a partition the plugin asks sinfo for the cluster's default: none here
        "partition": slurm.Executor.get_partition_arg(executor, job) if job.resources.get("slurm_partition") else "",
        "workdir": None,
    }
    sbatch = get_submit_command(job, params) + set_gres_string(job)
    srun = " ".join(
        [jobstep.get_cpu_setting(job, gpu_job), jobstep.get_gpu_setting(job), jobstep.get_node_setting(job)]
    )
    resources = {k: v for k, v in job.resources.items() if isinstance(v, (int, str, float))}
    return {
        "rule": job.name,
        # a local rule runs on the submitting host (job.is_local is True for every job of --dag)
        "localrule": job.rule.name in job.dag.workflow._localrules or job.rule.norun,
        "threads": job.threads,
        "resources": resources,
        "mpi": "mpi" in job.resources.keys(),
        "sbatch": sbatch,
        "srun": srun,
        # what the job runs and in which env (tests/test_envs.py checks the env has what it imports)
        "conda_env": str(job.rule.conda_env) if job.rule.conda_env else None,
        "shell": job.rule.shellcmd,
    }


def capture(self) -> None:
    """Replaces Workflow.printdag: build the DAG as --dag does, then describe its jobs."""
    self._prepare_dag(forceall=self.dag_settings.forceall, ignore_incomplete=True, lock_warn_only=True)
    self._build_dag()
    jobs = sorted(self.dag.jobs, key=lambda j: (j.name, str(j.wildcards)))
    print(json.dumps([describe(job) for job in jobs]))


if __name__ == "__main__":
    snakemake.workflow.Workflow.printdag = capture
    snakemake.cli.main([*sys.argv[1:], "--dag", "--quiet", "rules"])
