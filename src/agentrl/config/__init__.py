"""Configuration: one JSON schema, validated once, turned into frozen dataclasses.

The schema (``workflow/schemas/config.schema.yaml``) is the single source of keys, types and
defaults, and its defaults are ``config.yaml``'s values (a test compares them), so a stage run
without ``--config`` runs the default recipe. The workflow checks its config at load time with
:func:`check_workflow_config` (strings read as the schema's types, defaults filled, the
dataclasses built); every stage CLI validates again with :func:`load_config`, so a stage run by
hand gets the same defaults and the same errors.

Stage CLIs accept ``--config FILE`` (YAML/JSON, the whole config) and ``--config-json STR``
(what the Snakemake rules pass: only the sections the stage reads). Keys marked ``x-rerun:
false`` in the schema change speed or bookkeeping only;
:func:`agentrl.config_schema.rerun_keys` leaves them out of what the rules compare
(rules/common.smk).

The parts, bottom up: :mod:`~agentrl.config.sections` (the dataclasses and ``ConfigError``),
:mod:`~agentrl.config.loading` (schema validation with defaults, building, YAML files, CLI
arguments), :mod:`~agentrl.config.checks` (cross-key checks) and
:mod:`~agentrl.config.workflow_check` (the Snakefile's load-time check). This package imports no
stage package: it is the layer every stage builds on.
"""

from agentrl.config.checks import (
    TP_KEY,
    check_cross_keys,
    colocated_engine_problems,
    cross_key_problems,
    gpu_split,
    lora_section_problems,
    process_count_problems,
    rollout_placement,
    trainer_processes,
)
from agentrl.config.loading import (
    add_config_arguments,
    config_from_args,
    load_config,
    load_config_file,
    read_config_yaml,
    validate_and_fill,
)
from agentrl.config.sections import (
    AblationArmConfig,
    AblationEvalConfig,
    AblationGrpoConfig,
    AblationQuestionsConfig,
    AblationsConfig,
    Config,
    ConfigError,
    DataConfig,
    DeepSpeedConfig,
    DynamicSamplingConfig,
    EmbeddedDataConfig,
    EmbeddedModelConfig,
    EvalConfig,
    FilterConfig,
    GrpoAlgorithmConfig,
    GrpoConfig,
    GrpoValidationConfig,
    LoraConfig,
    ModelConfig,
    ModelSourceConfig,
    OverlongConfig,
    PretrainConfig,
    RewardConfig,
    RolloutConfig,
    SandboxConfig,
    SftConfig,
    SourceConfig,
    ToolCallShapingConfig,
    ToolConfig,
    TrackingConfig,
    UpstreamDataConfig,
    VllmConfig,
    WandbConfig,
)
from agentrl.config.workflow_check import check_model_sources, check_workflow_config, config_sources

# the schema the config is validated against, beside the loaders
from agentrl.config_schema import load_schema

__all__ = [
    "AblationArmConfig",
    "AblationEvalConfig",
    "AblationGrpoConfig",
    "AblationQuestionsConfig",
    "AblationsConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DeepSpeedConfig",
    "DynamicSamplingConfig",
    "EmbeddedDataConfig",
    "EmbeddedModelConfig",
    "EvalConfig",
    "FilterConfig",
    "GrpoAlgorithmConfig",
    "GrpoConfig",
    "GrpoValidationConfig",
    "LoraConfig",
    "ModelConfig",
    "ModelSourceConfig",
    "OverlongConfig",
    "PretrainConfig",
    "RewardConfig",
    "RolloutConfig",
    "SandboxConfig",
    "SftConfig",
    "SourceConfig",
    "TP_KEY",
    "ToolCallShapingConfig",
    "ToolConfig",
    "TrackingConfig",
    "UpstreamDataConfig",
    "VllmConfig",
    "WandbConfig",
    "add_config_arguments",
    "check_cross_keys",
    "check_model_sources",
    "check_workflow_config",
    "colocated_engine_problems",
    "config_from_args",
    "config_sources",
    "cross_key_problems",
    "load_config",
    "load_config_file",
    "load_schema",
    "lora_section_problems",
    "process_count_problems",
    "read_config_yaml",
    "rollout_placement",
    "gpu_split",
    "trainer_processes",
    "validate_and_fill",
]
