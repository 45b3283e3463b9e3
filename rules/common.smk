# Path helpers and input functions shared by the rule files; nothing else.
import functools
import hashlib
import json
import os
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

RESULTS = config["results_dir"]
LOGS = f"{RESULTS}/logs"  # under results_dir: runs of two presets keep their own logs
SRC = str(Path(workflow.current_basedir).parent / "src")  # this file's folder: also when used as a module

# Stages run as `python -m agentrl ...`; with the package installed (pip install -e .) this is a
# no-op, inside a per-rule conda env (--sdm conda) it makes the checkout's package importable.
# Every rule's command ends in `2>&1 | keep_log {log} || show_error {log}`, shell functions of
# rules/job_log.sh (beside this file) that keep every attempt's log and say why a job failed.
JOB_LOG_FUNCTIONS = str(Path(workflow.current_basedir) / "job_log.sh")
# A prefix of our own replaces Snakemake's default one ("set -euo pipefail; "), so it is restated
# first: without pipefail a command's exit status is keep_log's, and a stage that failed (or
# stopped with 75 for a requeue) would count as a job that "completed successfully" with its
# outputs missing. The functions are sourced, not inlined: Snakemake prints the prefix with the
# command of a failed local job. (Snakemake formats the prefix too: ${PYTHONPATH:-} needs its
# braces quadrupled.)
shell.prefix(f"set -euo pipefail; export PYTHONPATH={SRC}:${{{{PYTHONPATH:-}}}}; . {shlex.quote(JOB_LOG_FUNCTIONS)}; ")

sys.path.insert(0, SRC)  # the checkout's package decides what is read from the hub
from agentrl.config import load_config, process_count_problems, rollout_placement, trainer_processes  # noqa: E402
from agentrl.config_schema import load_schema, rerun_keys  # noqa: E402
from agentrl.hub import needs_hub  # noqa: E402
from agentrl.sft.pretrain import PRETRAIN_KEYS  # noqa: E402
from agentrl.training.slurm_jobs import gres_gpus  # noqa: E402

NEEDS_HUB = needs_hub(load_config(config, origin="workflow config"))


def result(path):
    return f"{RESULTS}/{path}"


def benchmarks():
    """Eval sets written by prepare_data (the embedded families or the paper's benchmarks)."""
    if config["data"]["source"] == "embedded":
        return list(config["data"]["embedded"]["families"])
    return list(config["data"]["upstream"]["eval"])


CONFIG_SCHEMA = load_schema()


def _compact(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# Each job's config reaches its stage as a file, `--config {params.cfg:q}`: inline JSON made every
# command line 3 KB (printed twice for a failed job, and once per job by `snakemake -n -p`). The
# file is named by its content, written when the job's params are evaluated (a dry run too, so a
# printed command runs by hand) and never rewritten with another content: a dry run with an overlay
# cannot change the config of a run's jobs still to come, and the job's own snakemake under SLURM
# finds the file the controller wrote.
STAGE_CONFIGS = f"{RESULTS}/config"


@functools.lru_cache(maxsize=None)
def stage_config_file(name, text):
    """``results/config/<name>-<sha256 of text>.json`` holding ``text``, written unless it is there."""
    path = Path(STAGE_CONFIGS) / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
    try:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            partial.write_text(text, encoding="utf-8")
            partial.replace(path)  # whole or absent: a job that starts meanwhile reads no half file
    except OSError as error:
        raise WorkflowError(f"cannot write the {name} stage's config file {path}: {error.strerror}") from None
    return str(path)


def config_params(*sections, name, build=None, example=None):
    """A stage's config as params: ``cfg``, the path of the JSON file it reads (`--config
    {params.cfg:q}`, :func:`stage_config_file`; ``name`` begins the file name), and one param per
    key whose change re-runs it, as ``"grpo.lr=0.0001"``.

    Snakemake re-runs a job when the values of its params change, and its reason lists the
    values before and now: here the changed keys. It does not compare a param computed by a
    function of ``input`` (derived from the input files, whose changes it tracks itself): ``cfg``
    is one, so the keys the schema marks ``x-rerun: false`` (speed, parallelism, bookkeeping;
    agentrl.config_schema.rerun_keys) reach the stage and re-run nothing.

    The config is the top-level ``sections`` the stage reads, or ``build(wildcards)`` for one
    assembled per job; ``example`` (wildcard values) lists its keys, the same for every job.
    """
    if build is None:
        build = lambda wildcards: {key: config[key] for key in sections}
    keyed = functools.lru_cache(maxsize=None)(lambda items: rerun_keys(build(SimpleNamespace(**dict(items))), CONFIG_SCHEMA))
    per_job = lambda wildcards: keyed(tuple(sorted(wildcards.items())))
    text = lambda wildcards: json.dumps(build(wildcards), sort_keys=True, indent=1) + "\n"
    params = {"cfg": lambda wildcards, input: stage_config_file(name, text(wildcards))}
    for index, key in enumerate(rerun_keys(build(SimpleNamespace(**(example or {}))), CONFIG_SCHEMA)):
        params[f"config_{index}"] = lambda wildcards, key=key: f"{key}={_compact(per_job(wildcards).get(key))}"
    return params


def final_targets():
    # The base model only where it is evaluated (training reaches it through sft anyway): a run of
    # released models (eval.models: [], or sft.from) builds no model of its own.
    base = [result("models/base/config.json")] if "base" in config["eval"]["models"] else []
    return [*base, *REPORT_TARGETS, *LIVECODEBENCH_EXPORTS]


# --------------------------------------------------------------------------- released models
# sft.from and the eval.checkpoints given as {id, revision} name models that local rules link or
# download (rules/model.smk), instead of a stage training them.
def model_source(value):
    """{id, revision} of a model source in the config (a plain string: an id at the hub's main)."""
    return {"id": value, "revision": None} if isinstance(value, str) else {"revision": None, **value}


def local_model_input(source):
    """A local folder's config.json as an input (a re-stamped folder re-runs its link); none for a hub id."""
    folder = Path(source["id"]).expanduser()
    return [str(folder / "config.json")] if folder.is_dir() else []


SFT_FROM = None if config["sft"]["from"] is None else model_source(config["sft"]["from"])
# The embedded base model learns to copy before SFT (model.embedded.pretrain, rules/model.smk):
# SFT then starts from results/models/pretrained, the random-init results/models/base stays the
# tokenizer's folder and the "base" of eval.models.
PRETRAIN = config["model"]["base"] == "embedded" and config["model"]["embedded"]["pretrain"]["enable"]
SFT_START = result("models/pretrained/config.json") if PRETRAIN else result("models/base/config.json")
# The pretraining runs SFT's trainer with model.embedded.pretrain's epochs, batch, lr and warmup in
# place of SFT's (agentrl.sft.pretrain); every other sft key applies to it and re-runs it.
PRETRAIN_REPLACES = (*PRETRAIN_KEYS, "from")  # agentrl.sft.pretrain: the one list of the replaced keys


def pretrain_config(keys=None):
    pretrain = config["model"]["embedded"]["pretrain"]
    return {
        "seed": config["seed"],
        "model": {"embedded": {"pretrain": pretrain if keys is None else {k: pretrain[k] for k in keys}}},
    }
# eval.checkpoints: a string is a local folder read where it is; {id, revision} is fetched here.
FETCHED_CHECKPOINTS = {
    name: model_source(value) for name, value in config["eval"]["checkpoints"].items() if not isinstance(value, str)
}


def checkpoint_config(name):
    """The config.json that tracks the eval.checkpoints entry ``name``."""
    if name in FETCHED_CHECKPOINTS:
        return result(f"models/checkpoints/{name}/config.json")
    return f"{config['eval']['checkpoints'][name]}/config.json"


def on_gpus(command):
    """``command`` run on devices of its own: the job's ``resources.gpu`` of them.

    Rules that can use GPUs declare the resource ``gpu=0`` (a CPU run) and start their
    command through this; a profile sets ``gpu`` per rule name. Snakemake only keeps the sum of the
    running jobs' ``gpu`` within ``--resources gpu=N``; ``agentrl.devices`` claims that many
    free devices of the machine (or of the SLURM job) and sets ``CUDA_VISIBLE_DEVICES``, so that
    eight one-GPU jobs run on eight GPUs. ``gpu=0`` runs the command unchanged.
    """
    return f"python -m agentrl.devices --gpus {{resources.gpu}} -- {command}"


def on_training_nodes(command):
    """A training stage's ``command`` on the job's nodes, GPUs and threads, through on_gpus.

    A one-node job asks for its GPUs by the ``gpu`` resource (what the SLURM plugin submits as
    ``--gpus``); a job of several nodes (AGENTRL_NODES; rules/cluster.smk checks them) by ``gres:
    gpu:N``, N per node (``--gres``, which SLURM reads per node: ``--gpus`` would let it place 6 + 2
    GPUs where the stage starts 4 + 4 processes). Each node claims and runs
    ``params.gpus_per_node`` (:func:`gpus_per_node`) processes, and ``threads`` are a node's. With
    several nodes the stage starts one torchrun per node with srun (agentrl.training.launch).
    """
    return (
        "python -m agentrl.devices --gpus {params.gpus_per_node} -- "
        + command
        + " --nproc {params.gpus_per_node} --nodes {resources.nodes} --threads {threads}"
    )


def node_gpus(resources):
    """(GPUs of each node, nodes) of a job's or rule's resources (a mapping): ``gres: gpu:N`` asks
    for N on each node, else ``gpu`` counts all of the job's. None for a value not known yet."""
    nodes, gpus = resources.get("nodes") or 1, resources.get("gpu") or 0
    per_node = gres_gpus(str(resources.get("gres") or ""))
    if per_node is None:
        if not (isinstance(gpus, int) and isinstance(nodes, int)):
            return None, nodes
        per_node = gpus // max(nodes, 1)
    return per_node, nodes


def gpus_per_node(wildcards, resources):
    """The GPUs of each node of a training job (a param of ``resources``: no rerun when it changes)."""
    return node_gpus(resources)[0]


def _constant(resource):
    """A rule's resource value when it is a constant (a callable stays unknown until its jobs exist)."""
    if hasattr(resource, "is_evaluable"):
        return None if resource.is_evaluable() else resource.value
    return None if callable(resource) else resource


def _rule_resources(each):
    """A rule's constant resources with the --default-resources it has no own value for."""
    defaults = workflow.resource_settings._parsed_default_resources
    merged = {name: _constant(value) for name, value in (defaults.items() if defaults is not None else [])}
    merged.update({name: _constant(value) for name, value in each.resources.items()})
    # A text value is an expression evaluated per job; gres ("gpu:8") evaluates to itself: kept as written
    gres = each.resources.get("gres") or (defaults.get("gres") if defaults is not None else None)
    if getattr(gres, "raw", None):
        merged["gres"] = gres.raw
    return {name: value for name, value in merged.items() if value is not None}


GPU_SETTING = "AGENTRL_GPUS_PER_NODE"  # read by the workflow profile, workflow/profiles/default


def check_gpu_requests():
    """Refuse, when the workflow loads, GPU requests that would fail once jobs run.

    - More ``gpu`` in one rule than ``--resources gpu`` allows. Snakemake's scheduler
      would stop when that job is ready, after the jobs before it ran, while a dry run passes.
    - A GPU pool (``--resources gpu=N``, profiles/local) that no rule asks a GPU of. The
      workflow profile was given no GPU count, and the GPU stages would run on CPUs.
    - GPUs asked by ``gres`` for a one-node job, or beside ``gpu``: on_gpus reads the job's ``gpu``
      resource (the processes and devices it starts), which stays 0 then; the SLURM plugin builds
      ``--gpus`` from ``gpu`` and ``gpu_model`` just as well. Only a job of several nodes asks
      per node with ``gres: gpu:N`` (the workflow profile's AGENTRL_NODES; rules/cluster.smk).
    """
    pool = _constant(workflow.global_resources.get("gpu"))
    asking = {}
    for each in workflow.rules:
        resources = _rule_resources(each)
        gres = str(resources.get("gres", ""))
        several_nodes = not resources.get("gpu") and isinstance(resources.get("nodes"), int) and resources["nodes"] > 1
        if "gpu" in gres and not (several_nodes and gres_gpus(gres) is not None):
            raise WorkflowError(
                f"resources gres={gres} in the {each.name} rule: this workflow counts a job's GPUs by its gpu "
                "resource (it starts that many processes on that many devices), which gres leaves at 0. Ask for "
                "gpu: N instead, with gpu_model: TYPE for a GPU type (the SLURM plugin then submits --gpus=TYPE:N)."
            )
        per_node, nodes = node_gpus(resources)
        if isinstance(per_node, int) and per_node > 0:
            asking[each.name] = per_node * nodes
    if not isinstance(pool, int):
        return
    too_many = {name: gpus for name, gpus in asking.items() if gpus > pool}
    if too_many:
        listed = ", ".join(f"{name} (gpu={gpus})" for name, gpus in sorted(too_many.items()))
        raise WorkflowError(
            f"--resources gpu={pool}, but these rules ask for more GPUs than that: {listed}; they would stop the "
            f"workflow when they are ready to run. Run with {GPU_SETTING}={pool} instead: the workflow profile "
            "(workflow/profiles/default) then sizes every GPU rule to it (--set-resources on the command line "
            "would replace all of the profile's per-rule resources)."
        )
    if pool > 0 and not asking:
        raise WorkflowError(
            f"--resources gpu={pool} makes GPUs available, but none is asked for by any job. {GPU_SETTING} is not set, so "
            f"the workflow profile (workflow/profiles/default) left every rule on CPUs. Run with {GPU_SETTING}={pool}."
        )


def _world_size(each):
    """The ranks of a training rule's job: its GPUs (every node's), or one CPU process per node."""
    per_node, nodes = node_gpus(_rule_resources(each))
    if not (isinstance(per_node, int) and isinstance(nodes, int)):
        return None  # a callable resource stays unchecked here; the stage checks it
    return max(per_node, 1) * max(nodes, 1)


def _grpo_trainer_ranks(each, grpo, world):
    """A GRPO job's trainer ranks and what its placement cannot do: under ``grpo.placement:
    separate`` on GPUs the rollout engine takes ``grpo.rollout_share`` of the node's GPUs
    (agentrl.config.gpu_split) and the trainer the rest, on one node."""
    per_node, nodes = node_gpus(_rule_resources(each))
    gpus = (per_node or 0) * nodes
    if rollout_placement(grpo) != "separate" or gpus < 1:
        return world, []
    if nodes > 1:
        return world, ["grpo.placement: separate runs on one node (the rollout engine beside the trainer's ranks)"]
    if gpus == 1 and config["rollout"]["engine"] == "vllm":
        return world, [
            "grpo.placement: separate with rollout.engine: vllm needs two GPUs or more (vLLM's weight transfer is "
            "NCCL, which connects no two processes on one device)"
        ]
    return trainer_processes(grpo, gpus), []


def check_process_counts(checked):
    """Refuse, before anything is submitted, a training job whose ranks cannot split its batches.

    A training job runs one rank per GPU of its ``gpu`` resource (all of its nodes'; set by the
    profile, AGENTRL_GPUS_PER_NODE and AGENTRL_NODES), and every rank takes the same share: GRPO's
    batch sizes (``agentrl.config.process_count_problems``) and SFT's global batch must be
    multiples of that count. The stages check it again once their ranks started; here a mismatch
    costs no queue time. The ablation jobs only get a warning: the targets are not known while the
    workflow loads, and a profile sized for the paper's batches must not stop the main workflow for
    them.
    """
    for each in workflow.rules:
        if each.name not in ("sft", "grpo", "ablation_grpo"):
            continue
        world = _world_size(each)
        if world is None:
            continue
        main = each.name != "ablation_grpo"
        if each.name == "sft":
            size = checked.sft.global_batch_size
            problems = [] if size % world == 0 else [f"sft.global_batch_size ({size}) must be a multiple of it"]
        else:
            section = "grpo" if main else "ablations.grpo"
            grpo = checked.grpo if main else checked.ablations.grpo
            trainers, problems = _grpo_trainer_ranks(each, grpo, world) if main else (world, [])
            problems += process_count_problems(grpo, trainers, section)
        if not problems:
            continue
        nodes = _rule_resources(each).get("nodes", 1)
        on_nodes = f" on {nodes} nodes" if nodes > 1 else ""
        if each.name != "sft" and trainers != world:
            on_nodes += f", {trainers} of them training beside the rollout engine (grpo.rollout_share)"
        message = f"config: the {each.name} rule's gpu resource ({world}{on_nodes}): " + "; ".join(problems)
        if main:
            sys.exit(message)
        logger.warning(f"{message}. `snakemake ablations` would stop at that stage: AGENTRL_GPUS_PER_NODE / AGENTRL_NODES")


# The conda env of the stages that roll out (filter scoring, GRPO, evaluation): vLLM when it is the engine.
ROLLOUT_ENV = "../envs/vllm.yaml" if config["rollout"]["engine"] == "vllm" else "../envs/train.yaml"


def input_dir(input_key="model"):
    """A param holding the folder of an input file (a model folder is an input through its config.json)."""
    return lambda wildcards, input: str(Path(input[input_key]).parent)


def parent_dir(output_key):
    """A param holding the folder of an output file (model folders are tracked by a file inside)."""

    def folder(wildcards, output):
        files = output[output_key]
        first = files if isinstance(files, str) else files[0]
        return str(Path(first).parent)

    return folder


# --------------------------------------------------------------------------- ablations
# Input functions of rules/ablations.smk (the paper's ablations; config `ablations`).
ABLATIONS = config["ablations"]
ABLATION_QUESTIONS = ("data", "algorithm", "reasoning")
# Arms the questions compare; one shared by several questions (the baseline) runs once.
ABLATION_ARMS = list(dict.fromkeys(arm for q in ABLATION_QUESTIONS for arm in ABLATIONS["questions"][q]))
# An arm a question names but ablations.arms does not define: the short config message (the
# Snakefile's for a bad key), not a traceback; the schema cannot say it (a cross-key rule).
_undefined_arms = {
    q: [arm for arm in ABLATIONS["questions"][q] if arm not in ABLATIONS["arms"]] for q in ABLATION_QUESTIONS
}
if any(_undefined_arms.values()):
    sys.exit(
        "config: invalid configuration\n"
        + "\n".join(
            f"  - 'ablations.questions.{q}' names undefined arm(s) {arms}; allowed arms (ablations.arms): "
            f"{sorted(ABLATIONS['arms'])}"
            for q, arms in _undefined_arms.items()
            if arms
        )
    )


def ablation_result(path):
    return result(f"ablations/{path}")


def ablation_grpo_cfg(wildcards):
    """The grpo stage's config for one arm and seed: the main sections, the ablation budget, the arm's variant."""
    grpo = {**config["grpo"], **ABLATIONS["grpo"], "variant": ABLATIONS["arms"][wildcards.arm]["variant"], "algorithm": {}}
    sections = {key: config[key] for key in ("rollout", "reward", "sandbox", "tool", "tracking")}
    return {"seed": int(wildcards.seed), **sections, "grpo": grpo}


def ablation_eval_cfg(wildcards):
    sections = {key: config[key] for key in ("rollout", "reward", "sandbox", "tool", "tracking")}
    sampling = {
        "n": ABLATIONS["eval"]["n"],
        **{key: config["eval"][key] for key in ("temperature", "top_p", "max_prompt_tokens")},
    }
    return {"seed": int(wildcards.seed), **sections, "eval": sampling}


# Wildcards that list the keys of the ablation configs (every arm and seed has the same keys).
ABLATION_EXAMPLE = {"arm": ABLATION_ARMS[0], "seed": str(ABLATIONS["seeds"][0])}


# ablations.arms.<arm>.sft_data other than real -> the data.embedded keys its SFT data set sets;
# each one an arm names gets a data set and an SFT model of its own (rules/ablations.smk). Both
# keys, so that each set is what its name says whatever the main config holds (a reasoning mode
# needs real trajectories); on the embedded default each changes one key.
ABLATION_SFT_DATA = {
    "stitched": {"sft_trajectories": "stitched", "reasoning_mode": "plain"},
    "deliberative": {"sft_trajectories": "real", "reasoning_mode": "deliberative"},
    "reactive": {"sft_trajectories": "real", "reasoning_mode": "reactive"},
}


def prepare_data_cfg(data):
    """prepare-data's config with the ``data`` section given; of reward only unknown_source: every
    row is routed to a verifier there, before any rollout."""
    return {
        "seed": config["seed"],
        "data": data,
        **{key: config[key] for key in ("sandbox", "tool")},
        "reward": {"unknown_source": config["reward"]["unknown_source"]},
    }


def ablation_data_cfg(wildcards):
    """The prepare-data config of one SFT-data arm: the main one with its data.embedded keys changed."""
    embedded = {**config["data"]["embedded"], **ABLATION_SFT_DATA[wildcards.sft_data]}
    return prepare_data_cfg({**config["data"], "embedded": embedded})


def ablation_sft_model(wildcards):
    sft_data = ABLATIONS["arms"][wildcards.arm]["sft_data"]
    if sft_data == "real":
        return result("models/sft/config.json")
    if config["data"]["source"] != "embedded":
        raise ValueError(
            f"ablations.arms.{wildcards.arm}: sft_data {sft_data!r} is written by the embedded generator; "
            f"data.source is {config['data']['source']!r}"
        )
    return ablation_result(f"shared/{sft_data}_sft/model/config.json")


def ablation_rl_data(wildcards):
    kind = ABLATIONS["arms"][wildcards.arm]["rl_data"]
    return result("filter/rl_train.parquet") if kind == "filtered" else result("data/rl_pool.parquet")


# --------------------------------------------------------------------------- stage inputs
# Input and config functions of rules/filter.smk, rules/rl.smk and rules/eval.smk.
def filter_score_config():
    return {
        **{key: config[key] for key in ("seed", "rollout", "reward", "sandbox", "tool")},
        "filter": {key: config["filter"][key] for key in ("k", "temperature", "top_p")},
    }


def grpo_validation_benchmarks():
    """The eval sets GRPO validates on: `grpo.validation.benchmarks`, or every set when null.

    Validation at paper scale costs more than training (4 sets x n=32 every 10 steps is ~13,900
    trajectories); upstream validates on AIME24/25 only, which the paper preset chooses.
    """
    chosen = config["grpo"]["validation"]["benchmarks"]
    if chosen is None:
        return benchmarks()
    unknown = [name for name in chosen if name not in benchmarks()]
    if unknown:
        raise WorkflowError(
            f"grpo.validation.benchmarks names {', '.join(unknown)}, which the data source does not "
            f"write; choose from {', '.join(benchmarks())} (or null for all)"
        )
    return list(chosen)


def eval_model_config(w):
    """A model folder is tracked by its config.json: the stage's output, or the checkpoint's."""
    return checkpoint_config(w.model) if w.model in EVAL_CHECKPOINTS else result(f"models/{w.model}/config.json")


# --------------------------------------------------------------------------- evaluation halves
# EVAL_HALF_DIRS, EVAL_MODELS and EVAL_HALVES are rules/eval.smk's.
def eval_reasoning(wildcards, input):
    """The --reasoning of a job, from its {half} folder (a param of ``input``: Snakemake compares
    the path, not the param)."""
    return {folder: mode for mode, folder in EVAL_HALF_DIRS.items()}[wildcards.half]


def eval_results(path, benchmarks_=None):
    """``path`` (with {model}, {half} and {benchmark}) for every evaluated model, half and benchmark."""
    return expand(
        result(path), model=EVAL_MODELS, half=EVAL_HALVES, benchmark=benchmarks() if benchmarks_ is None else benchmarks_
    )


# --------------------------------------------------------------------------- the cost table
COST_RULES = ("pretrain", "sft", "grpo", "score_rl_pool", "evaluate")


def cost_resources(w):
    """``--gpus RULE=N --threads RULE=N`` of the rules that may use GPUs, as the profiles set them
    (the report's cost table, agentrl.report.cost)."""
    args = []
    for each in workflow.rules:
        if each.name in COST_RULES:
            per_node, nodes = node_gpus(_rule_resources(each))
            threads = getattr(each.resources.get("_cores"), "value", each.resources.get("_cores"))
            args.append(f"--gpus {each.name}={per_node * nodes if isinstance(per_node, int) else 0}")
            args.append(f"--threads {each.name}={threads if isinstance(threads, int) else 1}")
    return " ".join(args)
