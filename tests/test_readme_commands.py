"""The README's commands plan what the README says they do, read from the README itself.

Two settings side by side: the README's overlay (a heredoc) gives its setting a ``results_dir`` of
its own; a dry run of each of its two commands must put every output, log and timing of that
setting under its folder, and the report where the command's comment says, without touching the
other's. The smoke run's job count, stated in the README and docs/operations.md, must be the
dry run's (they said 25 and 28 before).
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml
from helpers.workflows import ROOT, job_counts, merged, snakemake

from agentrl.config import check_workflow_config, config_sources, load_config

README = (ROOT / "README.md").read_text(encoding="utf-8")
# `cat > NAME <<'EOF'` ... `EOF`, then the lines of the same block
HEREDOC = re.compile(r"^cat > (\S+) <<'EOF'\n(.*?)\nEOF\n(.*?)^```", re.S | re.M)
# `snakemake --cores all [--configfile X]   # ... -> PATH/report/summary.md`
COMMAND = re.compile(r"^(snakemake --cores all[^#\n]*?)\s*#.*->\s*(\S+)/report/summary\.md$", re.M)
PATHS = re.compile(r"^\s+(?:output|log|benchmark): (.+)$", re.M)


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def _comparison() -> tuple[str, str, list[tuple[list[str], str]]]:
    """The README's overlay file name and text, and each command's arguments and results folder."""
    found = HEREDOC.search(_section(README, "## Changing one thing"))
    assert found, "the README's comparison shows its overlay as cat > NAME <<'EOF' ... EOF"
    name, text, rest = found.groups()
    commands = [(shlex.split(command)[3:], folder) for command, folder in COMMAND.findall(rest)]
    return name, text, commands


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder holding what a checkout holds at its root for these commands: config.yaml."""
    path = tmp_path_factory.mktemp("readme")
    shutil.copy(ROOT / "config.yaml", path / "config.yaml")
    return path


def _planned_paths(workdir: Path, *args: str) -> tuple[list[str], dict[str, int]]:
    done = snakemake(workdir, "-n", *args, timeout=300)
    listing = done.stdout + done.stderr
    paths = [path.strip() for line in PATHS.findall(listing) for path in line.split(",")]
    return paths, job_counts(listing)


def test_the_two_settings_plan_into_their_own_folders(workdir):
    name, text, commands = _comparison()
    (workdir / name).write_text(text + "\n")
    assert [folder for _, folder in commands] == ["results", yaml.safe_load(text)["results_dir"]]
    plans = {folder: _planned_paths(workdir, *args)[0] for args, folder in commands}
    default, changed = plans["results"], plans[yaml.safe_load(text)["results_dir"]]
    for folder, paths in plans.items():
        assert f"{folder}/report/summary.md" in paths, f"{folder}: no report planned"
        assert any(path.startswith(f"{folder}/models/rl/") for path in paths), f"{folder}: no GRPO planned"
        stray = [path for path in paths if not path.startswith(f"{folder}/")]
        assert stray == [], f"{folder}'s command plans files elsewhere: {stray[:5]}"
    into_other = [path for path in default if path.startswith(f"{yaml.safe_load(text)['results_dir']}/")]
    assert into_other == [], into_other
    assert len(default) == len(changed), "the changed setting is a whole run of its own"


def test_the_overlay_changes_the_one_key_it_names(workdir):
    name, text, _ = _comparison()
    overlay = yaml.safe_load(text)
    config = merged(yaml.safe_load((ROOT / "config.yaml").read_text()), overlay)
    checked = check_workflow_config(config, config_sources([ROOT / "config.yaml", workdir / name], {}))
    default = load_config({})
    # PyYAML reads 2e-5 as a string (YAML 1.1); the workflow reads it as the schema's number
    assert checked.grpo.lr == float(overlay["grpo"]["lr"]) != default.grpo.lr
    assert checked.results_dir == overlay["results_dir"] != default.results_dir
    stated = re.search(r"config\.yaml: ([0-9.e+-]+)\)", text)
    assert stated and float(stated[1]) == default.grpo.lr, f"the overlay's comment names the default: {text!r}"


def test_the_smoke_runs_job_count_is_the_dry_runs(workdir):
    _, counts = _planned_paths(workdir, "--configfile", str(ROOT / "presets" / "smoke.yaml"))
    total = sum(counts.values())
    stated = {
        "README.md": _section(README, "## First: the smoke run"),
        "docs/operations.md": _section((ROOT / "docs" / "operations.md").read_text(encoding="utf-8"), "## Smoke run"),
    }
    for doc, text in stated.items():
        numbers = re.findall(r"\((\d+) jobs", text)
        assert numbers, f"{doc} states no job count for the smoke run"
        assert [int(n) for n in numbers] == [total], f"{doc} says {numbers} jobs, the dry run plans {total}"
