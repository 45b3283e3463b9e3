"""The config's sections as frozen dataclasses, one per section of the schema.

They declare no defaults of their own: the schema's defaults (``config.yaml``'s values) fill every
key before a section is built (:mod:`agentrl.config.loading`), so a value missing there is a bug
caught at build time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from agentrl.errors import UserInputError


class ConfigError(UserInputError):
    """A config value is missing, unknown or of the wrong type; the message names the key."""


@dataclass(frozen=True)
class EmbeddedDataConfig:
    families: tuple[str, ...]
    sft_per_family: int
    rl_pool_per_family: int
    eval_per_family: int
    failed_attempt_share: float
    direct_answer_share: float
    prompt_style: Literal["compact", "paper"]
    sft_trajectories: Literal["real", "stitched"]
    reasoning_mode: Literal["plain", "deliberative", "reactive"]

    def __post_init__(self) -> None:
        # The stitched writer pre-writes its text without the tool; a reasoning mode is how the real
        # writer's turns think before a call, so the two ablations' data sets do not combine.
        if self.sft_trajectories != "real" and self.reasoning_mode != "plain":
            raise ConfigError(
                f"data.embedded.reasoning_mode: {self.reasoning_mode} needs data.embedded.sft_trajectories: real "
                f"(it is {self.sft_trajectories}): the reasoning modes rewrite the real trajectories; set "
                "reasoning_mode: plain or sft_trajectories: real"
            )


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
    sft_tool_arguments: Literal["parsed", "as_stored"]


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
class PretrainConfig:
    """The embedded model's pretraining on copying conversations before SFT (agentrl.sft.pretrain)."""

    enable: bool
    conversations: int  # copying conversations (agentrl.data.copy_corpus), each seen ``epochs`` times
    max_spans: int  # spans named and copied per conversation, at most
    verbatim_share: float  # share of conversations whose assistant turn repeats the user turn as it stands
    letter_share: float  # share of conversations answering a printed letter list as the choice family does
    epochs: int
    global_batch_size: int
    lr: float
    lr_schedule: Literal["cosine", "constant"]
    warmup_ratio: float


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
    tool_header: Literal["compact", "qwen3"]
    pretrain: PretrainConfig

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
    stdio_tests: Literal["project", "upstream"]
    code_ground_truth: Literal["json", "literal_eval"]
    empty_fn_name: Literal["stdio", "upstream"]
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
    overlong_prompts: Literal["drop", "error"]
    max_model_len: Literal["with_schema", "upstream"]
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
class LoraConfig:
    """``sft.lora`` and ``grpo.lora``: LoRA adapters in place of full fine-tuning (agentrl.training.lora)."""

    enabled: bool
    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]  # module names, or ("all-linear",): every linear layer but the output head
    modules_to_save: tuple[str, ...]  # modules trained whole beside the adapters (PEFT's), e.g. embed_tokens


@dataclass(frozen=True)
class SftConfig:
    epochs: int
    global_batch_size: int
    micro_batch_size: int
    micro_batch_tokens: int | None
    micro_batch_overhead_tokens: int | None
    packing: bool
    max_length: int
    truncation: Literal["right", "error"]
    loss_mask_alignment: Literal["target", "input"]
    loss_weighting: Literal["step_tokens", "micro_batch_mean", "micro_batch_sum"]
    lr: float
    lr_schedule: Literal["cosine", "constant"]
    warmup_ratio: float
    weight_decay: float
    betas: tuple[float, ...]
    grad_clip: float
    save_every_steps: int
    save_every_minutes: float | None
    save_before_end_minutes: float | None
    collective_timeout_minutes: float
    keep_checkpoints: int | None
    deepspeed: DeepSpeedConfig
    lora: LoraConfig
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
    balance_sources: bool
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
    epoch_end: Literal["carry", "drop_last"]
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
    packing: bool
    balance_ranks: bool
    rollout_queue: Literal["shared", "fixed"]
    queue_groups_in_flight: int | None
    max_staleness: int
    placement: Literal["auto", "colocated", "separate"]
    rollout_share: float
    rollout_engines: int | None
    behaviour_weight_cap: float
    skip_zero_advantage: bool
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
    save_before_end_minutes: float | None
    collective_timeout_minutes: float
    keep_checkpoints: int | None
    deepspeed: DeepSpeedConfig
    lora: LoraConfig


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
    sft_data: Literal["real", "stitched", "deliberative", "reactive"]
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
