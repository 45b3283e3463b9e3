"""Configuration: one JSON schema, validated once, turned into frozen dataclasses.

The schema (``workflow/schemas/config.schema.yaml``) is the single source of keys, types and
defaults. Snakemake validates the workflow's config against it at load time
(``snakemake.utils.validate``); every stage CLI validates again with :func:`load_config`, so a
stage run by hand gets the same defaults and the same errors. The dataclasses below declare no
defaults of their own: a value missing from the schema's defaults is a bug caught at build time.

Stage CLIs accept ``--config FILE`` (YAML/JSON, the whole config) and ``--config-json STR``
(what the Snakemake rules pass: only the sections the stage reads, so that a change in another
section does not re-run it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).resolve().parent / "resources" / "config.schema.yaml"


class ConfigError(ValueError):
    """A config value is missing, unknown or of the wrong type; the message names the key."""


# --------------------------------------------------------------------------- sections
@dataclass(frozen=True)
class EmbeddedDataConfig:
    families: tuple[str, ...]
    sft_per_family: int
    rl_pool_per_family: int
    eval_per_family: int
    failed_attempt_share: float
    prompt_style: Literal["compact", "paper"]
    sft_trajectories: Literal["real", "stitched"]


@dataclass(frozen=True)
class SourceConfig:
    id: str
    file: str | None


@dataclass(frozen=True)
class UpstreamDataConfig:
    sft: SourceConfig
    rl: SourceConfig
    eval: dict[str, SourceConfig]
    max_sft_rows: int | None
    max_rl_rows: int | None
    rl_prompt_wrapping: Literal["per_row", "per_file"]


@dataclass(frozen=True)
class DataConfig:
    source: Literal["embedded", "upstream"]
    embedded: EmbeddedDataConfig
    upstream: UpstreamDataConfig

    @property
    def benchmarks(self) -> tuple[str, ...]:
        """Names of the eval sets this data source writes (``results/data/eval/<name>.parquet``)."""
        if self.source == "embedded":
            return self.embedded.families
        return tuple(self.upstream.eval)


@dataclass(frozen=True)
class EmbeddedModelConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    base: str
    embedded: EmbeddedModelConfig


@dataclass(frozen=True)
class SandboxConfig:
    backend: Literal["local", "sandbox_fusion"]
    workers: int
    timeout_s: float
    cpu_time_s: int
    memory_mb: int
    max_processes: int
    max_file_mb: int
    max_output_bytes: int
    network_isolation: Literal["required", "best_effort"]
    sandbox_fusion_url: str
    preload_modules: tuple[str, ...]


@dataclass(frozen=True)
class ToolConfig:
    max_output_chars: int
    print_last_line: Literal["expression", "always"]


@dataclass(frozen=True)
class OverlongConfig:
    enable: bool
    max_response_length: int
    buffer_length: int
    penalty_factor: float


@dataclass(frozen=True)
class ToolCallShapingConfig:
    enable: bool
    per_call: float
    cap: float
    correct_bonus: bool
    call_count: Literal["counted", "released"]


@dataclass(frozen=True)
class RewardConfig:
    math_mode: Literal["strict", "math_verify"]
    choice_mode: Literal["letter", "exact"]
    unknown_source: Literal["error", "math"]
    strict_tail_chars: int
    code_case_timeout_s: float
    overlong: OverlongConfig
    tool_call_shaping: ToolCallShapingConfig


@dataclass(frozen=True)
class VllmConfig:
    gpu_memory_utilization: float
    tensor_parallel_size: int
    enforce_eager: bool
    max_num_seqs: int


@dataclass(frozen=True)
class RolloutConfig:
    engine: Literal["hf", "vllm"]
    max_turns: int
    max_prompt_tokens: int
    prompt_length_with_tools: bool
    max_response_tokens: int
    tool_response_over_budget: Literal["cut", "drop"]
    temperature: float
    top_p: float
    top_k: int
    batch_size: int
    dtype: Literal["auto", "float32", "bfloat16", "float16"]
    vllm: VllmConfig


@dataclass(frozen=True)
class SftDeepSpeedConfig:
    zero_stage: int
    dtype: Literal["auto", "float32", "bfloat16"]
    gradient_checkpointing: bool


@dataclass(frozen=True)
class SftConfig:
    epochs: int
    global_batch_size: int
    micro_batch_size: int
    micro_batch_tokens: int | None
    max_length: int
    truncation: Literal["right", "error"]
    lr: float
    lr_schedule: Literal["cosine", "constant"]
    warmup_ratio: float
    weight_decay: float
    betas: tuple[float, ...]
    grad_clip: float
    save_every_steps: int
    save_every_minutes: float | None
    keep_checkpoints: int | None
    deepspeed: SftDeepSpeedConfig


@dataclass(frozen=True)
class FilterConfig:
    k: int
    temperature: float
    top_p: float
    low: float
    high: float
    easy_min: float
    hard_max: float
    target_histogram: dict[str, float] | None
    target_pass_rates: str | None
    target_size: int | None


@dataclass(frozen=True)
class EvalConfig:
    n: int
    temperature: float
    top_p: float
    max_prompt_tokens: int
    models: tuple[str, ...]
    checkpoints: dict[str, str]


@dataclass(frozen=True)
class GrpoAlgorithmConfig:
    """Overrides of the variant's algorithm settings (agentrl.grpo.variants); None = the variant's value."""

    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] | None
    ratio_level: Literal["token", "sequence"] | None
    clip_low: float | None
    clip_high: float | None
    clip_c: float | None
    kl_coef: float | None
    kl_estimator: Literal["k1", "k2", "k3"] | None
    entropy_coef: float | None
    overlong_shaping: bool | None
    norm_adv_by_std: bool | None


@dataclass(frozen=True)
class DynamicSamplingConfig:
    enable: bool
    max_rollout_batches: int


@dataclass(frozen=True)
class GrpoValidationConfig:
    n: int
    temperature: float
    top_p: float
    max_problems: int | None


@dataclass(frozen=True)
class GrpoDeepSpeedConfig:
    zero_stage: int
    dtype: Literal["auto", "float32", "bfloat16"]
    gradient_checkpointing: bool


@dataclass(frozen=True)
class GrpoConfig:
    variant: str
    algorithm: GrpoAlgorithmConfig
    dynamic_sampling: DynamicSamplingConfig
    epochs: int
    max_steps: int | None
    batch_prompts: int
    n: int
    mini_batch_prompts: int
    ppo_epochs: int
    micro_batch_tokens: int
    logit_chunk_tokens: int
    lr: float
    lr_schedule: Literal["constant", "cosine"]
    lr_warmup_steps: int
    weight_decay: float
    betas: tuple[float, ...]
    grad_clip: float
    test_freq: int
    val_before_train: bool
    validation: GrpoValidationConfig
    save_freq: int
    save_every_minutes: float | None
    keep_checkpoints: int | None
    deepspeed: GrpoDeepSpeedConfig
    tensorboard: bool


@dataclass(frozen=True)
class AblationArmConfig:
    sft_data: Literal["real", "stitched"]
    rl_data: Literal["filtered", "pool"]
    variant: str


@dataclass(frozen=True)
class AblationQuestionsConfig:
    data: tuple[str, ...]
    algorithm: tuple[str, ...]
    reasoning: tuple[str, ...]


@dataclass(frozen=True)
class AblationGrpoConfig:
    max_steps: int
    batch_prompts: int
    n: int
    mini_batch_prompts: int
    test_freq: int
    val_before_train: bool


@dataclass(frozen=True)
class AblationEvalConfig:
    n: int
    max_problems: int | None


@dataclass(frozen=True)
class AblationsConfig:
    seeds: tuple[int, ...]
    arms: dict[str, AblationArmConfig]
    questions: AblationQuestionsConfig
    grpo: AblationGrpoConfig
    eval: AblationEvalConfig
    accuracy_threshold: float
    smoothing_window: int
    deliberative_max_calls: int
    deliberative_min_tokens_per_call: int


@dataclass(frozen=True)
class Config:
    seed: int
    results_dir: str
    data: DataConfig
    model: ModelConfig
    sandbox: SandboxConfig
    tool: ToolConfig
    reward: RewardConfig
    rollout: RolloutConfig
    sft: SftConfig
    filter: FilterConfig
    eval: EvalConfig
    grpo: GrpoConfig
    ablations: AblationsConfig


# --------------------------------------------------------------------------- loading
def load_schema() -> dict[str, Any]:
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _extend_with_defaults(validator_class):
    """A validator that fills in ``default`` values, as snakemake.utils.validate(set_default=True)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = json.loads(json.dumps(sub["default"]))
                elif "$ref" in sub and key not in instance and "default" in sub:
                    instance[key] = json.loads(json.dumps(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_DefaultFillingValidator = _extend_with_defaults(jsonschema.Draft202012Validator)


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<top level>"


def _describe(error: jsonschema.ValidationError) -> str:
    key = _key_path(error)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        return f"unknown key(s) {unknown} under '{key}'; allowed keys: {allowed}"
    if error.validator == "enum":
        return f"'{key}' = {error.instance!r} is not allowed; choose one of {error.validator_value}"
    if error.validator == "type":
        return f"'{key}' = {error.instance!r} has the wrong type; expected {error.validator_value}"
    if error.validator == "propertyNames":
        return f"'{key}': {error.message}; allowed names: {error.validator_value.get('enum')}"
    return f"'{key}': {error.message}"


def validate_and_fill(raw: dict[str, Any], origin: str = "config") -> dict[str, Any]:
    """Validate ``raw`` against the schema, filling defaults in place; raise ConfigError with every problem."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: the config must be a mapping, got {type(raw).__name__}")
    validator = _DefaultFillingValidator(load_schema())
    errors = sorted(validator.iter_errors(raw), key=lambda e: list(e.absolute_path))
    if errors:
        lines = "\n".join(f"  - {_describe(e)}" for e in errors)
        raise ConfigError(f"{origin}: invalid configuration\n{lines}")
    return raw


def _build(cls: Any, value: Any, key: str) -> Any:
    """Turn validated plain data into the (possibly nested) dataclass ``cls``."""
    origin = typing.get_origin(cls)
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for field in dataclasses.fields(cls):
            sub_key = f"{key}.{field.name}" if key else field.name
            if field.name not in value:
                raise ConfigError(f"missing config key '{sub_key}' (and the schema has no default for it)")
            kwargs[field.name] = _build(hints[field.name], value[field.name], sub_key)
        return cls(**kwargs)
    if origin is tuple:
        (item_type, _ellipsis) = typing.get_args(cls)
        return tuple(_build(item_type, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        _, value_type = typing.get_args(cls)
        return {k: _build(value_type, v, f"{key}.{k}") for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        non_none = [t for t in typing.get_args(cls) if t is not type(None)]
        return _build(non_none[0], value, key)
    if cls is float and isinstance(value, int):
        return float(value)
    return value


def load_config(raw: dict[str, Any] | None = None, origin: str = "config") -> Config:
    """Validate a plain config mapping (partial is fine: defaults fill the rest) into a :class:`Config`."""
    data = validate_and_fill(json.loads(json.dumps(raw or {})), origin)
    return _build(Config, data, "")


def load_config_file(path: str | Path) -> Config:
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return load_config(raw, origin=str(path))


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--config", type=Path, help="YAML/JSON config file (default: built-in defaults)")
    group.add_argument("--config-json", help="config as a JSON string (what the Snakemake rules pass)")


def config_from_args(args: argparse.Namespace) -> Config:
    if getattr(args, "config_json", None):
        try:
            raw = json.loads(args.config_json)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--config-json is not valid JSON: {exc}") from None
        return load_config(raw, origin="--config-json")
    if getattr(args, "config", None):
        return load_config_file(args.config)
    return load_config({})
