# Path helpers and input functions shared by the rule files; nothing else.
import json
from pathlib import Path

RESULTS = config["results_dir"]
LOGS = f"{RESULTS}/logs"  # under results_dir: runs of two presets keep their own logs
SRC = str(Path(workflow.basedir).parent / "src")

# Stages run as `python -m agentrl ...`; with the package installed (pip install -e .) this is a
# no-op, inside a per-rule conda env (--sdm conda) it makes the checkout's package importable.
shell.prefix(f"export PYTHONPATH={SRC}:$PYTHONPATH; ")


def result(path):
    return f"{RESULTS}/{path}"


def benchmarks():
    """Eval sets written by prepare_data (the embedded families or the paper's benchmarks)."""
    if config["data"]["source"] == "embedded":
        return list(config["data"]["embedded"]["families"])
    return list(config["data"]["upstream"]["eval"])


def config_json(*sections):
    """The config sections a stage reads, as one JSON string for `--config-json`.

    Used through `params:`, so Snakemake re-runs a stage when (and only when) a section it
    reads changes.
    """
    return json.dumps({key: config[key] for key in sections}, sort_keys=True, separators=(",", ":"))


def final_targets():
    # The base model is a target of its own (a run of the embedded default always shows it), except
    # where nothing reads it: a run that starts from released models and does not evaluate base.
    base = [] if SFT_FROM is not None and "base" not in config["eval"]["models"] else [result("models/base/config.json")]
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
# eval.checkpoints: a string is a local folder read where it is; {id, revision} is fetched here.
FETCHED_CHECKPOINTS = {
    name: model_source(value) for name, value in config["eval"]["checkpoints"].items() if not isinstance(value, str)
}


def checkpoint_config(name):
    """The config.json that tracks the eval.checkpoints entry ``name``."""
    if name in FETCHED_CHECKPOINTS:
        return result(f"models/checkpoints/{name}/config.json")
    return f"{config['eval']['checkpoints'][name]}/config.json"


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
_undefined_arms = sorted(set(ABLATION_ARMS) - set(ABLATIONS["arms"]))
if _undefined_arms:
    raise ValueError(
        f"config: ablations.questions names undefined arm(s) {_undefined_arms}; "
        f"defined under ablations.arms: {sorted(ABLATIONS['arms'])}"
    )


def ablation_result(path):
    return result(f"ablations/{path}")


def ablation_grpo_cfg(wildcards):
    """The grpo stage's config for one arm and seed: the main sections, the ablation budget, the arm's variant."""
    grpo = {**config["grpo"], **ABLATIONS["grpo"], "variant": ABLATIONS["arms"][wildcards.arm]["variant"], "algorithm": {}}
    sections = {key: config[key] for key in ("rollout", "reward", "sandbox", "tool")}
    return json.dumps({"seed": int(wildcards.seed), **sections, "grpo": grpo}, sort_keys=True, separators=(",", ":"))


def ablation_eval_cfg(wildcards):
    sections = {key: config[key] for key in ("rollout", "reward", "sandbox", "tool")}
    sampling = {
        "n": ABLATIONS["eval"]["n"],
        **{key: config["eval"][key] for key in ("temperature", "top_p", "max_prompt_tokens")},
    }
    return json.dumps({"seed": int(wildcards.seed), **sections, "eval": sampling}, sort_keys=True, separators=(",", ":"))


def ablation_sft_model(wildcards):
    arm = ABLATIONS["arms"][wildcards.arm]
    if arm["sft_data"] == "real":
        return result("models/sft/config.json")
    if config["data"]["source"] != "embedded":
        raise ValueError(
            f"ablations.arms.{wildcards.arm}: sft_data 'stitched' is written by the embedded generator; "
            f"data.source is {config['data']['source']!r}"
        )
    return ablation_result("shared/stitched_sft/model/config.json")


def ablation_rl_data(wildcards):
    kind = ABLATIONS["arms"][wildcards.arm]["rl_data"]
    return result("filter/rl_train.parquet") if kind == "filtered" else result("data/rl_pool.parquet")
