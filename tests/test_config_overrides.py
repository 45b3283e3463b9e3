"""Overrides as a user types them: strings read as the schema's types, one source of defaults, and
the workflow's short message for a bad key.

Snakemake reads a nested ``--config grpo='{lr: 2e-4}'`` with YAML's BaseLoader (every scalar a
string) and PyYAML reads ``lr: 1e-5`` as a string; agentrl.config_schema.coerce_to_schema reads them as
the type the schema declares for the key, and only then.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers.workflows import ROOT, jobs_in_listing, rules_of, run_snakemake, shell_commands, stage_config

from agentrl.config import (
    ConfigError,
    check_workflow_config,
    config_sources,
    load_config,
    load_config_file,
    validate_and_fill,
)
from agentrl.config_schema import coerce_to_schema, load_schema, rerun_free_keys, rerun_keys


def coerced(raw: dict) -> dict:
    schema = load_schema()
    return coerce_to_schema(raw, schema, schema)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ({"grpo": {"lr": "2e-4"}}, {"grpo": {"lr": 2e-4}}),  # number, YAML 1.2 exponent without a dot
        ({"grpo": {"lr": "1.0e-6"}}, {"grpo": {"lr": 1e-6}}),
        ({"sandbox": {"timeout_s": "3"}}, {"sandbox": {"timeout_s": 3}}),  # number written as an integer
        ({"rollout": {"max_turns": "4"}}, {"rollout": {"max_turns": 4}}),  # integer
        ({"grpo": {"val_before_train": "false"}}, {"grpo": {"val_before_train": False}}),  # boolean
        ({"reward": {"overlong": {"enable": "True"}}}, {"reward": {"overlong": {"enable": True}}}),
        ({"grpo": {"max_steps": "null"}}, {"grpo": {"max_steps": None}}),  # [integer, null]
        ({"grpo": {"max_steps": "7"}}, {"grpo": {"max_steps": 7}}),
        ({"grpo": {"algorithm": {"clip_high": "0.28"}}}, {"grpo": {"algorithm": {"clip_high": 0.28}}}),
        ({"grpo": {"algorithm": {"kl_estimator": "null"}}}, {"grpo": {"algorithm": {"kl_estimator": None}}}),
        ({"sft": {"betas": ["0.9", "0.99"]}}, {"sft": {"betas": [0.9, 0.99]}}),  # array items
        ({"ablations": {"seeds": ["4", "5"]}}, {"ablations": {"seeds": [4, 5]}}),
        ({"filter": {"target_histogram": {"easy": "1", "medium": "0.5", "hard": "0"}}},
         {"filter": {"target_histogram": {"easy": 1, "medium": 0.5, "hard": 0}}}),  # [object, null]
        ({"data": {"upstream": {"eval": {"aime2024": {"id": "x", "file": "null"}}}}},
         {"data": {"upstream": {"eval": {"aime2024": {"id": "x", "file": None}}}}}),  # through $ref
        # oneOf/anyOf: the types of every branch ($ref'd ones too), null read first
        ({"sft": {"from": "null"}}, {"sft": {"from": None}}),  # oneOf [null, model_source]
        ({"sft": {"from": "~"}}, {"sft": {"from": None}}),
        ({"sft": {"from": {"id": "org/name", "revision": "null"}}},
         {"sft": {"from": {"id": "org/name", "revision": None}}}),  # the object branch of model_source
        ({"eval": {"checkpoints": {"step40": {"id": "org/name", "revision": "null"}}}},
         {"eval": {"checkpoints": {"step40": {"id": "org/name", "revision": None}}}}),  # free names -> oneOf
    ],
)  # fmt: skip
def test_strings_are_read_as_the_declared_type(raw, expected):
    assert coerced(raw) == expected
    load_config(raw)  # and the result validates


@pytest.mark.parametrize(
    "raw",
    [
        {"model": {"base": "123"}},  # a string key keeps a number-like value
        {"results_dir": "1e-5"},
        {"sandbox": {"sandbox_fusion_url": "true"}},
        {"eval": {"checkpoints": {"step40": "0.5"}}},  # free names: the declared value type is string
        {"rollout": {"dtype": "float32"}},
        {"sft": {"from": "org/name"}},  # a hub id: the string branch of the oneOf keeps it
        {"sft": {"from": "2024"}},
        {"sft": {"from": {"id": "org/name", "revision": "1"}}},  # a revision named like a number
        {"eval": {"checkpoints": {"step40": "runs/step40"}}},  # a local folder
        {"eval": {"checkpoints": {"step40": "null"}}},  # model_source has no null branch
    ],
)
def test_a_string_key_stays_a_string(raw):
    assert coerced(json.loads(json.dumps(raw))) == raw


def test_a_string_of_no_declared_type_is_reported_as_given():
    with pytest.raises(ConfigError, match=r"'rollout\.max_turns' = '4\.5' has the wrong type; expected integer"):
        load_config({"rollout": {"max_turns": "4.5"}})
    with pytest.raises(ConfigError, match=r"'grpo\.val_before_train' = 'yes' has the wrong type; expected boolean"):
        load_config({"grpo": {"val_before_train": "yes"}})  # YAML 1.2: yes is a string


def test_an_overlay_with_an_exponent_loads(tmp_path):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("sft:\n  lr: 1e-5\ngrpo:\n  lr: 2E-6\n  algorithm:\n    clip_high: .315\n")
    assert yaml.safe_load(overlay.read_text())["sft"]["lr"] == "1e-5"  # what PyYAML gives
    cfg = load_config_file(overlay)
    assert (cfg.sft.lr, cfg.grpo.lr, cfg.grpo.algorithm.clip_high) == (1e-5, 2e-6, 0.315)


# --------------------------------------------------------------------------- one source of defaults
def _leaves(mapping: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{path}."))
        else:
            out[path] = value
    return out


def test_config_yaml_values_are_the_schema_defaults():
    """A stage CLI without --config runs what `snakemake` runs: config.yaml is the schema's defaults."""
    listed = _leaves(coerced(yaml.safe_load((ROOT / "config.yaml").read_text())))
    defaults = _leaves(validate_and_fill({}))
    differing = {
        key: (value, defaults.get(key, "<no default>")) for key, value in listed.items() if value != defaults.get(key)
    }
    differing |= {key: ("<not listed>", value) for key, value in defaults.items() if key not in listed}
    assert differing == {}, "config.yaml value vs schema default; set both to the same value:\n" + "\n".join(
        f"  {key}: {pair[0]!r} vs {pair[1]!r}" for key, pair in sorted(differing.items())
    )


def test_a_stage_without_config_runs_the_default_recipe():
    assert load_config({}) == load_config_file(ROOT / "config.yaml")


# --------------------------------------------------------------------------- the workflow's check
def test_errors_name_the_source_of_each_bad_key(tmp_path):
    base = tmp_path / "config.yaml"
    base.write_text("seed: 0\ngrpo:\n  lr: 1.0e-4\n")
    preset = tmp_path / "preset.yaml"
    preset.write_text("sft:\n  epochs: many\n")
    overrides = {"grpo": {"lr": "abc", "lrr": "1"}}
    config = {"seed": 0, "grpo": {"lr": "abc", "lrr": "1"}, "sft": {"epochs": "many"}}
    with pytest.raises(ConfigError) as error:
        check_workflow_config(config, config_sources([base, preset], overrides))
    lines = str(error.value).splitlines()
    assert lines[0] == f"config ({base} + {preset} + --config): invalid configuration"
    assert lines[1].startswith("  - --config: unknown key(s) ['lrr'] under 'grpo'; allowed keys: ['algorithm',")
    assert lines[2] == "  - --config: 'grpo.lr' = 'abc' has the wrong type; expected number"
    assert lines[3] == f"  - {preset}: 'sft.epochs' = 'many' has the wrong type; expected integer"
    assert len(lines) == 4


def dry_run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    (workdir / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    return run_snakemake(workdir, "-n", "-p", *args, timeout=180)


def stage_configs(listing: str, stage: str, workdir: Path) -> list[dict]:
    """The config of every planned `python -m agentrl <stage>` command of a dry run."""
    return [stage_config(command, workdir) for command in shell_commands(listing) if f"-m agentrl {stage} " in command]


def test_workflow_takes_nested_numbers_from_the_command_line(tmp_path):
    done = dry_run(tmp_path, "--config", "grpo={lr: 2e-4, max_steps: 3}", "rollout={max_turns: 4}", "seed=5")
    assert done.returncode == 0, done.stderr[-3000:]
    (grpo,) = stage_configs(done.stdout, "grpo", tmp_path)
    assert (grpo["grpo"]["lr"], grpo["grpo"]["max_steps"], grpo["rollout"]["max_turns"], grpo["seed"]) == (
        2e-4,
        3,
        4,
        5,
    )
    assert grpo["grpo"]["batch_prompts"] == 32, "the rest of grpo comes from config.yaml"


def test_workflow_reads_sft_from_null_and_hub_ids_from_the_command_line(tmp_path):
    """sft.from is a oneOf without a type of its own: `{from: null}` trains SFT, a hub id is fetched."""
    overlay = tmp_path / "released.yaml"
    overlay.write_text("sft:\n  from: org/released-sft\n")
    files = ("--configfile", str(tmp_path / "config.yaml"), str(overlay))
    released = dry_run(tmp_path, *files)
    assert released.returncode == 0, released.stderr[-3000:]
    jobs = rules_of(jobs_in_listing(released.stdout + released.stderr))
    assert "released_sft" in jobs and "sft" not in jobs, "the overlay starts from a released model"
    trained = dry_run(tmp_path, *files, "--config", "sft={from: null}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    jobs = rules_of(jobs_in_listing(trained.stdout + trained.stderr))
    assert "sft" in jobs and "released_sft" not in jobs, "--config sft={from: null} trains SFT again"
    hub = dry_run(tmp_path, "--config", "sft={from: org/other-sft}")
    assert hub.returncode == 0, hub.stderr[-3000:]
    assert "released_sft" in rules_of(jobs_in_listing(hub.stdout + hub.stderr)) and "--id org/other-sft " in hub.stdout


def test_workflow_reports_an_undefined_ablation_arm_with_the_short_message(tmp_path):
    done = dry_run(tmp_path, "--config", "ablations={questions: {data: [baseline, nope]}}")
    assert done.returncode != 0
    assert "'ablations.questions.data' names undefined arm(s) ['nope']; allowed arms (ablations.arms): " in done.stderr
    arms = "['baseline', 'deliberative_sft', 'grpo_t', 'reactive_sft', 'stitched_sft', 'unfiltered']"
    assert arms in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) < 6, done.stderr


def test_workflow_runs_the_cross_key_checks_at_load(tmp_path):
    done = dry_run(tmp_path, "--config", "grpo={batch_prompts: 5}")
    assert done.returncode != 0
    assert "grpo.batch_prompts (5) must be a multiple of grpo.mini_batch_prompts (8)" in done.stderr, done.stderr


def test_workflow_reports_a_bad_key_with_the_short_message(tmp_path):
    done = dry_run(tmp_path, "--config", "grpo={lr: fast}")
    assert done.returncode != 0
    assert "--config: 'grpo.lr' = 'fast' has the wrong type; expected number" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) < 6, done.stderr


# --------------------------------------------------------------------------- what re-runs
def test_rerun_keys_leave_out_the_keys_marked_x_rerun_false():
    keys = rerun_keys(validate_and_fill({}))
    assert {"grpo.lr", "sandbox.memory_mb", "rollout.vllm.tensor_parallel_size", "seed"} <= set(keys)
    assert keys["grpo.lr"] == 1e-4  # the schema default
    for key in ("sandbox.workers", "sft.save_every_steps", "grpo.save_freq", "rollout.vllm.gpu_memory_utilization"):
        assert key in rerun_free_keys() and key not in keys
    # a mapping of free names is one key: adding a checkpoint to evaluate is one change
    assert keys["eval.checkpoints"] == {} and not any(key.startswith("eval.checkpoints.") for key in keys)
    assert keys["ablations.arms"]["baseline"]["variant"] == "grpo_tcr"


def _planned_rules(listing: str) -> set[str]:
    rules = set()
    for line in listing.splitlines():
        words = line.strip().split()
        if (
            len(words) == 2
            and words[0].endswith(":") is False
            and words[1].isdigit()
            and words[0] not in ("job", "total")
        ):
            rules.add(words[0])
    return rules


def test_the_smoke_preset_plans_every_job_of_the_default_target(tmp_path):
    default = dry_run(tmp_path)
    smoke = dry_run(tmp_path, "--configfile", str(ROOT / "config.yaml"), str(ROOT / "presets" / "smoke.yaml"))
    assert default.returncode == 0 and smoke.returncode == 0, smoke.stderr[-3000:]
    assert _planned_rules(smoke.stdout) == _planned_rules(default.stdout) >= {"sft", "grpo", "evaluate", "report"}
    assert "results/smoke/report/summary.md" in smoke.stdout, "the smoke run keeps its own folder"


def test_tracking_reaches_every_training_and_evaluation_stage(tmp_path):
    done = dry_run(tmp_path, "--config", "tracking={tensorboard: true}")
    assert done.returncode == 0, done.stderr[-3000:]
    # evaluation logs its metrics to the trackers where they are computed: the gather job
    # sft: the SFT job and the embedded model's pretraining (SFT's trainer, --recipe pretrain);
    # evaluate gather: sft and rl x 3 families
    for stage, jobs in (("sft", 2), ("grpo", 1), ("evaluate gather", 2 * 3)):
        configs = stage_configs(done.stdout, stage, tmp_path)
        assert len(configs) == jobs and all(c["tracking"]["tensorboard"] is True for c in configs), stage
