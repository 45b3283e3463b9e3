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
    return [result("models/base/config.json"), *REPORT_TARGETS, *LIVECODEBENCH_EXPORTS]


def parent_dir(output_key):
    """A param holding the folder of an output file (model folders are tracked by a file inside)."""

    def folder(wildcards, output):
        files = output[output_key]
        first = files if isinstance(files, str) else files[0]
        return str(Path(first).parent)

    return folder
