"""presets/paper-as-released.yaml: the released scripts' RL set and rules on top of the paper preset.

The released GRPO script trains on the whole RL-30K file (only verl's prompt-length filter), so
the overlay's dry run plans no model-aware scoring or selection and GRPO reads the fitted pool;
the paper preset keeps the selection. Every as-released option is set by the overlay and left
at the project's value by the paper preset and the embedded default.
"""

from __future__ import annotations

import re

import pytest
from helpers.presets import AS_RELEASED, PAPER, resolved
from helpers.workflows import ROOT, jobs_in_listing, rules_of, run_snakemake

from agentrl.config import load_config

FILTER_RULES = {"score_rl_pool", "gather_pass_rates", "scoring_config", "select_rl_data"}
# (section, key, as released): the options of docs/fidelity.md's "As released" table.
AS_RELEASED_OPTIONS = [
    ("filter", "selection", "pool"),
    ("data.upstream", "sft_tool_arguments", "as_stored"),
    ("tool", "print_last_line", "always"),
    ("tool", "code_block", "upstream"),
    ("reward", "code_case_memory_mb", 1024),
    ("reward", "code_block", "upstream"),
    ("reward", "functional_tests", "upstream"),
    ("reward", "stdio_tests", "upstream"),
    ("reward", "code_ground_truth", "literal_eval"),
    ("reward", "empty_fn_name", "upstream"),
    ("reward", "invalid_ground_truth", "score"),
    ("rollout", "tool_call_parsing", "upstream"),
    ("rollout", "tool_turn_framing", "upstream"),
    ("rollout", "overlong_prompts", "error"),
    ("rollout", "max_model_len", "upstream"),
    ("sft", "loss_mask_alignment", "input"),
    ("sft", "loss_weighting", "micro_batch_sum"),
    ("grpo", "loss_weighting", "micro_batch_share"),
    ("grpo", "epoch_end", "drop_last"),
]


def _dry_run(tmp_path, *presets) -> str:
    (tmp_path / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    args = ["-n", "-p", "--configfile", *map(str, presets)]
    done = run_snakemake(tmp_path, *args, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def _grpo_train_file(listing: str) -> str:
    (command,) = [line for line in listing.splitlines() if "-m agentrl grpo " in line]
    return re.search(r"--train (\S+)", command).group(1)


@pytest.mark.timeout(300)
def test_the_as_released_dry_run_trains_on_the_fitted_pool_and_plans_no_model_aware_filter(tmp_path):
    listing = _dry_run(tmp_path, PAPER, AS_RELEASED)
    planned = rules_of(jobs_in_listing(listing))
    assert {"fit_rl_prompts", "grpo", "report"} <= planned
    assert not planned & FILTER_RULES, planned & FILTER_RULES
    assert _grpo_train_file(listing) == "results-as-released/data/rl_pool.parquet"  # fit_rl_prompts' output


@pytest.mark.timeout(300)
def test_the_paper_preset_keeps_the_model_aware_selection_as_a_stage(tmp_path):
    listing = _dry_run(tmp_path, PAPER)
    assert FILTER_RULES <= rules_of(jobs_in_listing(listing))
    assert _grpo_train_file(listing) == "results/filter/rl_train.parquet"


@pytest.mark.timeout(300)
def test_the_as_released_pass_rates_are_still_computed_when_asked_for(tmp_path):
    listing = _dry_run(tmp_path, PAPER, AS_RELEASED)
    (tmp_path / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    done = run_snakemake(
        tmp_path, "-n", "results-as-released/filter/stats.json", "--configfile", str(PAPER), str(AS_RELEASED)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert FILTER_RULES <= rules_of(jobs_in_listing(done.stdout + done.stderr))
    assert "grpo" in rules_of(jobs_in_listing(listing))


def _option(cfg, section: str, key: str):
    for part in section.split("."):
        cfg = getattr(cfg, part)
    return getattr(cfg, key)


def _set_keys(options: dict, prefix: str = "") -> set[tuple[str, str]]:
    """(section, key) of every value the overlay sets, a nested section dotted (data.upstream)."""
    keys = set()
    for name, value in options.items():
        if isinstance(value, dict):
            keys |= _set_keys(value, f"{prefix}{name}.")
        else:
            keys.add((prefix.rstrip("."), name))
    return keys


def test_the_overlay_sets_every_as_released_option_and_the_paper_preset_none():
    default = load_config()
    paper = resolved(PAPER)
    released = resolved(PAPER, AS_RELEASED)
    for section, key, value in AS_RELEASED_OPTIONS:
        assert _option(released, section, key) == value, (section, key)
        if (section, key) != ("tool", "print_last_line"):  # the paper preset's own row of docs/fidelity.md
            assert _option(paper, section, key) != value, (section, key)
        assert _option(default, section, key) != value, (section, key)
    # everything else is the paper preset's
    assert (released.grpo.variant, released.grpo.n, released.rollout.max_prompt_tokens) == ("grpo_tcr", 16, 2560)
    assert released.results_dir != paper.results_dir


def test_every_option_the_overlay_sets_is_a_row_of_the_fidelity_table():
    import yaml

    overlay = yaml.safe_load(AS_RELEASED.read_text())
    options = {section: keys for section, keys in overlay.items() if section != "presets"}  # what it sits on
    set_keys = {entry for entry in _set_keys(options) if entry[0]}  # results_dir is no option
    documented = {(section, key) for section, key, _ in AS_RELEASED_OPTIONS}
    # sandbox.memory_mb restates the paper preset's 2048 (the tool's limit beside the tests' 1024)
    assert set_keys - {("sandbox", "memory_mb")} == documented
    table = (ROOT / "docs" / "fidelity.md").read_text()
    assert "149cf8a" in table
    for section, key in documented:
        assert f"`{section}.{key}`" in table, f"{section}.{key}"
