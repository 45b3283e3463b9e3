"""Configuration: one JSON schema, validated once, turned into frozen dataclasses.

The schema (``workflow/schemas/config.schema.yaml``) is the single source of keys, types and
defaults, and its defaults are ``config.yaml``'s values (a test compares them), so a stage run
without ``--config`` runs the default recipe. The workflow checks its config at load time with
:func:`check_workflow_config` (strings read as the schema's types, defaults filled, the
dataclasses built); every stage CLI validates again with :func:`load_config`, so a stage run by
hand gets the same defaults and the same errors. The dataclasses below declare no defaults of
their own: a value missing from the schema's defaults is a bug caught at build time.

Stage CLIs accept ``--config FILE`` (YAML/JSON, the whole config) and ``--config-json STR``
(what the Snakemake rules pass: only the sections the stage reads). Keys marked ``x-rerun:
false`` in the schema change speed or bookkeeping only;
:func:`agentrl.config_schema.rerun_keys` leaves them out of what the rules compare
(rules/common.smk).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jsonschema
import yaml

from agentrl.config_schema import coerce_to_schema, load_schema
from agentrl.errors import UserInputError


class ConfigError(UserInputError):
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
    revision: str | None  # hub commit hash (a pin), tag or branch; None = the default branch


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

    def __post_init__(self) -> None:
        # grouped-query attention shares each key/value head among num_heads / num_kv_heads query heads
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.embedded.num_kv_heads ({self.num_kv_heads}) must divide model.embedded.num_heads "
                f"({self.num_heads}): each key/value head serves a whole group of query heads"
            )


@dataclass(frozen=True)
class ModelSourceConfig:
    """A model to link or download: a hub id or a local folder, and a hub revision (None: main).

    The schema also takes a plain string, read as ``{id: <string>, revision: null}``.
    """

    id: str
    revision: str | None


@dataclass(frozen=True)
class ModelConfig:
    base: str
    revision: str | None  # of a hub model.base: commit hash (a pin), tag or branch; None = main
    embedded: EmbeddedModelConfig


@dataclass(frozen=True)
class SandboxConfig:
    backend: Literal["local", "sandbox_fusion"]
    workers: int | None  # None: the job's CPUs per process (agentrl.cpus.cpus_per_process)
    timeout_s: float
    cpu_time_s: int
    memory_mb: int
    max_processes: int
    max_file_mb: int
    max_output_bytes: int
    network_isolation: Literal["required", "best_effort"]
    sandbox_fusion_url: str
    preload_modules: tuple[str, ...]
    max_queue_wait_s: float | None  # None: a call waits for a worker as long as it takes
    max_infra_failure_share: float
    infra_failure_window: int


@dataclass(frozen=True)
class ToolConfig:
    max_output_chars: int
    print_last_line: Literal["expression", "always"]
    code_block: Literal["project", "upstream"]


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
    code_case_memory_mb: int | None  # None: sandbox.memory_mb
    code_block: Literal["project", "upstream"]
    functional_tests: Literal["project", "upstream"]
    invalid_ground_truth: Literal["error", "score"]
    overlong: OverlongConfig
    tool_call_shaping: ToolCallShapingConfig


@dataclass(frozen=True)
class VllmConfig:
    gpu_memory_utilization: float
    colocated_gpu_memory_utilization: float
    sleep_mode: bool
    tensor_parallel_size: int
    enforce_eager: bool
    max_num_seqs: int
    colocated_memory: str  # fraction | measured (agentrl.rollout.memory_plan)


@dataclass(frozen=True)
class RolloutConfig:
    engine: Literal["hf", "vllm"]
    max_turns: int
    max_prompt_tokens: int
    prompt_length_with_tools: bool
    max_response_tokens: int
    tool_response_over_budget: Literal["cut", "drop"]
    tool_call_parsing: Literal["lenient", "upstream"]
    tool_turn_framing: Literal["template", "upstream"]
    temperature: float
    top_p: float
    top_k: int
    batch_size: int
    scheduling: Literal["per_trajectory", "per_turn"]
    dtype: Literal["auto", "float32", "bfloat16", "float16"]
    vllm: VllmConfig


@dataclass(frozen=True)
class DeepSpeedConfig:
    """``sft.deepspeed`` and ``grpo.deepspeed`` (the schema says which ZeRO stages each takes)."""

    zero_stage: int
    dtype: Literal["auto", "float32", "bfloat16"]
    gradient_checkpointing: bool


@dataclass(frozen=True)
class SftConfig:
    epochs: int
    global_batch_size: int
    micro_batch_size: int
    micro_batch_tokens: int | None
    micro_batch_overhead_tokens: int | None
    max_length: int
    truncation: Literal["right", "error"]
    loss_mask_alignment: Literal["target", "input"]
    loss_weighting: Literal["step_tokens", "micro_batch_mean"]
    lr: float
    lr_schedule: Literal["cosine", "constant"]
    warmup_ratio: float
    weight_decay: float
    betas: tuple[float, ...]
    grad_clip: float
    save_every_steps: int
    save_every_minutes: float | None
    collective_timeout_minutes: float
    keep_checkpoints: int | None
    deepspeed: DeepSpeedConfig
    # the config key is ``sft.from`` (a Python keyword): see _config_key
    from_: ModelSourceConfig | None = dataclasses.field(metadata={"config_key": "from"})


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
    shards: int
    selection: Literal["band", "pool"]


@dataclass(frozen=True)
class EvalConfig:
    n: int
    temperature: float
    top_p: float
    max_prompt_tokens: int
    models: tuple[str, ...]
    checkpoints: dict[str, ModelSourceConfig]
    published: dict[str, str | None]
    shards: int
    reasoning: tuple[Literal["agentic", "self_contained"], ...]


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
    benchmarks: tuple[str, ...] | None


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
    old_logprobs: Literal["auto", "recompute", "engine"]
    micro_batch_tokens: int
    logit_chunk_tokens: int
    loss_weighting: Literal["mini_batch_tokens", "micro_batch_share"]
    share_prompts: bool
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
    collective_timeout_minutes: float
    keep_checkpoints: int | None
    deepspeed: DeepSpeedConfig


@dataclass(frozen=True)
class WandbConfig:
    enable: bool
    project: str
    entity: str | None
    mode: Literal["offline", "online"]


@dataclass(frozen=True)
class TrackingConfig:
    tensorboard: bool
    wandb: WandbConfig


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
    tracking: TrackingConfig
    ablations: AblationsConfig


# --------------------------------------------------------------------------- loading


def _extend_with_defaults(validator_class):
    """A validator that fills in ``default`` values, as snakemake.utils.validate(set_default=True)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:  # a $ref'd key too: its default sits beside the $ref
                    instance[key] = json.loads(json.dumps(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_DefaultFillingValidator = _extend_with_defaults(jsonschema.Draft202012Validator)


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<top level>"


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator in ("oneOf", "anyOf") and error.context:
        # "not valid under any of the given schemas" says nothing; the branch of the right type
        # does (a wrong key in an object), else the list of types that would do
        specific = [e for e in error.context if e.validator != "type"]
        if specific:
            return _describe(max(specific, key=lambda e: len(e.absolute_path)))
        types_ = [e.validator_value for e in error.context]
        return f"'{_key_path(error)}' = {error.instance!r} has the wrong type; expected one of {types_}"
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


def validate_and_fill(
    raw: dict[str, Any], origin: str = "config", source_of: Callable[[tuple[str, ...]], str] | None = None
) -> dict[str, Any]:
    """Validate ``raw`` against the schema, filling defaults in place; raise ConfigError with every problem.

    ``source_of`` names where the value at a key path came from (a file, ``--config``); each
    problem is then prefixed by it.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: the config must be a mapping, got {type(raw).__name__}")
    schema = load_schema()
    coerce_to_schema(raw, schema, schema)
    validator = _DefaultFillingValidator(schema)
    errors = sorted(validator.iter_errors(raw), key=lambda e: list(e.absolute_path))
    lines = [f"  - {_source_prefix(e, source_of)}{_describe(e)}" for e in errors]
    for path, value in _non_finite_numbers(raw, ()):
        where = f"{source_of(path)}: " if source_of else ""
        lines.append(f"  - {where}'{'.'.join(path)}' = {value!r}: not a finite number")
    if lines:
        raise ConfigError(f"{origin}: invalid configuration\n" + "\n".join(lines))
    return raw


def _non_finite_numbers(value: Any, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], float]]:
    """(key path, value) of every NaN or infinity: JSON Schema's ranges pass NaN (it compares false)."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(path, value)]
    if isinstance(value, dict):
        return [found for key, sub in value.items() for found in _non_finite_numbers(sub, (*path, str(key)))]
    if isinstance(value, list):
        return [found for i, sub in enumerate(value) for found in _non_finite_numbers(sub, (*path, str(i)))]
    return []


def _source_prefix(error: jsonschema.ValidationError, source_of: Callable[[tuple[str, ...]], str] | None) -> str:
    if source_of is None:
        return ""
    path = tuple(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = error.schema.get("properties", {})
        path += tuple(sorted(k for k in error.instance if k not in allowed))[:1]
    return f"{source_of(path)}: "


def _build(cls: Any, value: Any, key: str) -> Any:
    """Turn validated plain data into the (possibly nested) dataclass ``cls``."""
    origin = typing.get_origin(cls)
    if cls is ModelSourceConfig:  # a string is an id; a revision left out is the hub's main
        value = {"id": value, "revision": None} if isinstance(value, str) else {"revision": None, **value}
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for field in dataclasses.fields(cls):
            name = field.metadata.get("config_key", field.name)
            sub_key = f"{key}.{name}" if key else name
            if name not in value:
                raise ConfigError(f"missing config key '{sub_key}' (and the schema has no default for it)")
            kwargs[field.name] = _build(hints[field.name], value[name], sub_key)
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
    """Validate a plain config mapping (partial is fine: defaults fill the rest) into a :class:`Config`.

    Only what the schema says about each key (strings read as its types, unknown keys, types,
    ranges); no cross-key check: a stage that needs those calls :func:`check_cross_keys` itself
    (GRPO does), and the workflow runs them at load (:func:`check_workflow_config`).
    """
    data = validate_and_fill(json.loads(json.dumps(raw or {})), origin)
    return _build(Config, data, "")


def cross_key_problems(cfg: Config) -> list[str]:
    """What the schema cannot say about one key alone: each problem names the keys and why.

    The stages refuse these too, but only when they run (GRPO after SFT and scoring); the workflow
    calls :func:`check_cross_keys` when it loads, so ``snakemake -n`` refuses them.
    """
    problems = []
    for section, grpo in (("grpo", cfg.grpo), ("ablations.grpo", cfg.ablations.grpo)):
        if grpo.batch_prompts % grpo.mini_batch_prompts:
            problems.append(
                f"{section}.batch_prompts ({grpo.batch_prompts}) must be a multiple of {section}.mini_batch_prompts "
                f"({grpo.mini_batch_prompts}): every optimizer step sees the same number of prompts"
            )
    if cfg.grpo.share_prompts and cfg.grpo.deepspeed.gradient_checkpointing:
        problems.append(
            "grpo.share_prompts with grpo.deepspeed.gradient_checkpointing: the shared forward hands each prompt's "
            "keys and values to its responses through a KV cache, which transformers' checkpointed layers do not "
            "keep; turn one of them off"
        )
    if cfg.rollout.temperature <= 0:
        problems.append("rollout.temperature must be > 0 for GRPO: greedy rollouts of a group are identical")
    if cfg.rollout.engine == "vllm" and "rl" in cfg.eval.models:  # GRPO on vLLM (evaluation-only runs may use TP)
        problems += colocated_engine_problems(cfg.rollout)
    overlong = cfg.reward.overlong
    if overlong.buffer_length > overlong.max_response_length:
        problems.append(
            f"reward.overlong.buffer_length ({overlong.buffer_length}) exceeds reward.overlong.max_response_length "
            f"({overlong.max_response_length}): the penalty would start before the response does"
        )
    if _overlong_shaping_in_use(cfg) and cfg.rollout.max_response_tokens < overlong.max_response_length:
        problems.append(
            f"rollout.max_response_tokens ({cfg.rollout.max_response_tokens}) is below "
            f"reward.overlong.max_response_length ({overlong.max_response_length}): no response can reach the "
            "penalty's full length (at or below max_response_length - buffer_length it never applies); make them "
            "equal (upstream) or turn the overlong shaping off"
        )
    case_memory = cfg.reward.code_case_memory_mb
    if cfg.sandbox.backend == "local" and case_memory is not None and case_memory > cfg.sandbox.memory_mb:
        problems.append(
            f"reward.code_case_memory_mb ({case_memory}) exceeds sandbox.memory_mb ({cfg.sandbox.memory_mb}): the "
            "local sandbox forks its children under sandbox.memory_mb and a run can only lower it"
        )
    problems += _filter_problems(cfg.filter)
    return problems


TP_KEY = "rollout.vllm.tensor_parallel_size"


def colocated_engine_problems(rollout: RolloutConfig) -> list[str]:
    """What GRPO's colocated vLLM engines (one per trainer rank, :mod:`agentrl.rollout.vllm_engine`)
    cannot honour: tensor parallelism. Checked at workflow load when the run trains by GRPO on
    vLLM, and by the stage before it builds an engine (the ``snakemake ablations`` target too)."""
    if rollout.vllm.tensor_parallel_size == 1:
        return []
    return [
        f"{TP_KEY} = {rollout.vllm.tensor_parallel_size} with rollout.engine: vllm: GRPO runs one vLLM engine per "
        f"trainer rank on its own GPU (tensor parallel size 1); set {TP_KEY}: 1 (an evaluation-only run, "
        "eval.models without rl, may use more)"
    ]


def process_count_problems(grpo: GrpoConfig, processes: int, section: str = "grpo") -> list[str]:
    """What a GRPO job of ``processes`` ranks (its GPUs: the ``gpu`` resource of the grpo rule; 0 is
    one CPU process) cannot split: every rank rolls out and updates on the same number of prompts,
    so both batch sizes must be multiples of it. The workflow checks it at load against the rule's
    resource (``check_grpo_process_counts`` in rules/common.smk), the stage again once its ranks
    started (:class:`agentrl.grpo.step.GrpoStep`)."""
    processes = max(processes, 1)
    if not (grpo.batch_prompts % processes or grpo.mini_batch_prompts % processes):
        return []
    fits = [
        k for k in range(1, grpo.mini_batch_prompts + 1) if grpo.mini_batch_prompts % k == grpo.batch_prompts % k == 0
    ]
    return [
        f"{section}.batch_prompts ({grpo.batch_prompts}) and {section}.mini_batch_prompts ({grpo.mini_batch_prompts}) "
        f"must be multiples of the process count ({processes}): every rank rolls out the same number of prompts; "
        f"these sizes run on {', '.join(map(str, fits))} processes"
    ]


def _overlong_shaping_in_use(cfg: Config) -> bool:
    """Whether any stage applies the overlong penalty: the reward section, or a GRPO variant that turns it on."""
    if cfg.reward.overlong.enable:
        return True
    from agentrl.grpo.variants import VARIANTS  # lazy: the variants import this module

    variants = {cfg.grpo.variant, *(arm.variant for arm in cfg.ablations.arms.values())}
    forced = cfg.grpo.algorithm.overlong_shaping
    return bool(forced) or any(VARIANTS[v].overlong_shaping for v in variants if v in VARIANTS and forced is None)


def _filter_problems(cfg: FilterConfig) -> list[str]:
    problems = []
    if not cfg.low < cfg.high:
        problems.append(f"filter.low ({cfg.low}) must be below filter.high ({cfg.high}): the band would be empty")
    if not cfg.hard_max < cfg.easy_min:
        problems.append(f"filter.hard_max ({cfg.hard_max}) must be below filter.easy_min ({cfg.easy_min})")
    if cfg.target_histogram is not None and cfg.target_pass_rates is not None:
        problems.append("set filter.target_histogram or filter.target_pass_rates, not both")
    return problems


def check_cross_keys(cfg: Config, origin: str = "config") -> None:
    """Raise ConfigError listing every :func:`cross_key_problems` of ``cfg`` (none: return)."""
    problems = cross_key_problems(cfg)
    if problems:
        raise ConfigError(f"{origin}: inconsistent settings\n" + "\n".join(f"  - {p}" for p in problems))


class _StrictYamlLoader(yaml.SafeLoader):
    """YAML's safe loader refusing a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (first on line {seen[key]})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def read_config_yaml(path: str | Path) -> Any:
    """The YAML value of a config file; an unreadable file (missing, a folder, not UTF-8), a syntax
    error or a key given twice raises ConfigError naming the file and, for the YAML, the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        line = _line_of_byte(path, exc.start)
        raise ConfigError(f"{path}: line {line}: not UTF-8 text (byte {exc.object[exc.start]:#04x})") from None
    try:
        return yaml.load(text, Loader=_StrictYamlLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def _line_of_byte(path: Path, offset: int) -> int:
    """The 1-based line holding byte ``offset`` of ``path``."""
    with open(path, "rb") as fh:
        return fh.read(offset).count(b"\n") + 1


def load_config_file(path: str | Path) -> Config:
    return load_config(read_config_yaml(path) or {}, origin=str(path))


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--config",
        type=Path,
        help="YAML/JSON config file; keys left out take config.yaml's values (the schema defaults)",
    )
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


# --------------------------------------------------------------------------- the workflow's check
def config_sources(configfiles: list[str | Path], overrides: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Where the workflow's config came from, in the order Snakemake merged it: files, then ``--config``."""
    sources = []
    for path in map(Path, configfiles):
        name = os.path.relpath(path) if path.is_absolute() and path.is_relative_to(Path.cwd()) else str(path)
        sources.append((name, read_config_yaml(path) or {}))  # Snakemake's own read drops a key given twice
    if overrides:
        sources.append(("--config", dict(overrides)))
    return sources


def _source_of(sources: list[tuple[str, dict[str, Any]]]) -> Callable[[tuple[str, ...]], str]:
    """A function naming the last source that set a key path (or its nearest parent), else the schema."""

    def holds(mapping: Any, path: tuple[str, ...]) -> bool:
        for part in path:
            if not isinstance(mapping, dict) or part not in mapping:
                return False
            mapping = mapping[part]
        return True

    def source_of(path: tuple[str, ...]) -> str:
        for length in range(len(path), 0, -1):
            for name, mapping in reversed(sources):
                if holds(mapping, path[:length]):
                    return name
        return "schema default"

    return source_of


def check_workflow_config(config: dict[str, Any], sources: list[tuple[str, dict[str, Any]]]) -> Config:
    """What the Snakefile runs at load: coerce and validate ``config`` in place (defaults filled),
    then build it as every stage does, so the cross-key checks of :func:`load_config` run before
    any job. Errors name the source of each bad key (``config_sources``)."""
    origin = "config (" + " + ".join(name for name, _ in sources) + ")" if sources else "config"
    validate_and_fill(config, origin, _source_of(sources))
    cfg = load_config(config, origin)
    check_cross_keys(cfg, origin)
    check_model_sources(cfg)
    return cfg


def check_model_sources(cfg: Config) -> None:
    """``sft.from`` and each ``eval.checkpoints`` entry that names an existing folder must be a
    model folder (config.json, weights, tokenizer): else the link or the evaluation fails hours
    later. A hub id or a folder still to be made is left to its rule. Raises ModelFolderError."""
    from agentrl.model.folder import check_model_folder  # lazy: the folder module is not needed to load a config

    sources = [("sft.from", cfg.sft.from_)] + [(f"eval.checkpoints.{k}", v) for k, v in cfg.eval.checkpoints.items()]
    for key, source in sources:
        if source is not None and Path(source.id).expanduser().is_dir():
            check_model_folder(Path(source.id).expanduser(), key)
