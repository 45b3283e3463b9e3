"""The cross-key checks: what the schema cannot say about one key alone.

Pure functions of built sections, each problem a sentence naming the keys and why; the workflow
runs them at load (:mod:`agentrl.config.workflow_check`) and the stages that need them again.

They need no fact of a stage: the overlong penalty is in use, in any stage, exactly when
``reward.overlong.enable`` is on, since a GRPO variant only adds it where that key allows
(:func:`agentrl.grpo.variants.grpo_reward_config`); so the budget check reads that key alone and
this layer imports nothing from ``agentrl.grpo``.
"""

from __future__ import annotations

from agentrl.config.sections import Config, ConfigError, FilterConfig, GrpoConfig, RolloutConfig, SftConfig


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
    problems += placement_problems(cfg)
    # GRPO on colocated vLLM engines (evaluation-only runs may use TP; placement_problems has the separate one's)
    if cfg.rollout.engine == "vllm" and "rl" in cfg.eval.models and rollout_placement(cfg.grpo) == "colocated":
        problems += colocated_engine_problems(cfg.rollout)
    problems += overlong_window_problems(cfg)
    overlong = cfg.reward.overlong
    if not overlong.enable and cfg.grpo.algorithm.overlong_shaping:
        problems.append(
            "grpo.algorithm.overlong_shaping: true asks GRPO for reward.overlong's penalty, which "
            "reward.overlong.enable: false turns off in every stage; set reward.overlong.enable: true (or "
            "grpo.algorithm.overlong_shaping: null)"
        )
    case_memory = cfg.reward.code_case_memory_mb
    if cfg.sandbox.backend == "local" and case_memory is not None and case_memory > cfg.sandbox.memory_mb:
        problems.append(
            f"reward.code_case_memory_mb ({case_memory}) exceeds sandbox.memory_mb ({cfg.sandbox.memory_mb}): the "
            "local sandbox forks its children under sandbox.memory_mb and a run can only lower it"
        )
    problems += _filter_problems(cfg.filter)
    problems += lora_problems(cfg)
    return problems


def lora_problems(cfg: Config) -> list[str]:
    """What ``sft.lora`` and ``grpo.lora`` (agentrl.training.lora) do not support. Whether the target
    modules exist is checked against the model folder when the stage reads it."""
    return lora_section_problems("sft", cfg.sft) + lora_section_problems("grpo", cfg.grpo)


def lora_section_problems(section: str, stage: SftConfig | GrpoConfig) -> list[str]:
    """:func:`lora_problems` of one training section (``sft`` or ``grpo``), which its stage checks again."""
    lora, problems = stage.lora, []
    if "all-linear" in lora.target_modules and len(lora.target_modules) > 1:
        problems.append(
            f"{section}.lora.target_modules = {list(lora.target_modules)}: all-linear already names every "
            "linear layer; give all-linear alone or module names only"
        )
    if lora.enabled and stage.deepspeed.zero_stage == 3:
        problems.append(
            f"{section}.lora.enabled with {section}.deepspeed.zero_stage = 3: the merged export and weight "
            "pushes fold each adapter into its base weight, which ZeRO-3 holds partitioned (not supported); "
            "the frozen base weights have no optimizer state to shard, so use zero_stage 2 (or 0)"
        )
    if section == "grpo" and lora.enabled and lora.dropout > 0:
        problems.append(
            f"grpo.lora.dropout = {lora.dropout} with grpo.lora.enabled: the update's ratio compares its forward "
            "with the old log-probs of the same weights, and dropout makes them differ (not 1 at the first "
            "mini-batch); set grpo.lora.dropout: 0"
        )
    return problems


def rollout_placement(grpo: GrpoConfig) -> str:
    """``grpo.placement`` resolved: ``auto`` is ``separate`` when rollouts may be stale, else ``colocated``."""
    if grpo.placement != "auto":
        return grpo.placement
    return "separate" if grpo.max_staleness > 0 else "colocated"


def gpu_split(gpus: int, rollout_share: float) -> tuple[int, int]:
    """A node's ``gpus`` under ``grpo.placement: separate`` as (trainer GPUs, rollout GPUs): the
    rollout share rounded, at least one each (agentrl.grpo.rollout_process puts the rollout engine
    on the node's last GPUs). One GPU is shared, (1, 1): the trainer and an hf engine on it, the
    weights over gloo (NCCL connects no two processes on one device)."""
    if gpus < 1:
        raise ValueError(f"gpu_split needs at least one GPU, got {gpus}")
    if gpus == 1:
        return 1, 1
    rollout = min(gpus - 1, max(1, round(gpus * rollout_share)))
    return gpus - rollout, rollout


def trainer_processes(grpo: GrpoConfig, gpus: int) -> int:
    """GRPO's trainer ranks on a node of ``gpus`` GPUs (0: a CPU job, returned as is): all of them,
    or under ``grpo.placement: separate`` those :func:`gpu_split` leaves to training."""
    if gpus < 1 or rollout_placement(grpo) != "separate":
        return gpus
    return gpu_split(gpus, grpo.rollout_share)[0]


def placement_problems(cfg: Config) -> list[str]:
    """What the separate placement and stale rollouts (agentrl.grpo.rollout_process) need."""
    grpo, problems = cfg.grpo, []
    placement = rollout_placement(grpo)
    if grpo.max_staleness > 0 and placement == "colocated":
        problems.append(
            f"grpo.max_staleness = {grpo.max_staleness} with grpo.placement: colocated: rollouts can only run ahead "
            "of the update in a process of their own; set grpo.placement: separate (or auto)"
        )
    if grpo.max_staleness > 0 and grpo.old_logprobs == "engine":
        problems.append(
            "grpo.old_logprobs: engine with grpo.max_staleness > 0: the engine's log-probs are those of the stale "
            "policy that sampled, not of the weights the update starts from; use auto or recompute"
        )
    if grpo.deepspeed.zero_stage == 3 and placement != "separate":
        problems.append(
            "grpo.deepspeed.zero_stage = 3 with grpo.placement: colocated: the colocated engine shares the "
            "trainer's module (hf: it would gather every weight for each generated token) or reads its "
            "parameters (vllm: it would get the partitions); use zero_stage 2, or placement: separate, whose "
            "weight pushes gather each parameter once"
        )
    # The rollout engines span the GPUs grpo.rollout_share gives them (agentrl.grpo.rollout_process
    # .engine_layout: grpo.rollout_engines sets their tensor parallelism); the GPU count is the
    # job's, which the trainer checks once it knows its devices (rollout_gpus).
    tp = cfg.rollout.vllm.tensor_parallel_size
    if placement == "separate" and cfg.rollout.engine == "vllm" and tp != 1:
        problems.append(
            f"{TP_KEY} = {tp} with grpo.placement: separate: the rollout engines' tensor parallelism follows "
            f"from the GPUs grpo.rollout_share gives them and grpo.rollout_engines, whatever {TP_KEY} says; set "
            f"{TP_KEY}: 1 and choose the layout with those two keys"
        )
    return problems


def overlong_window_problems(cfg: Config) -> list[str]:
    """Where the overlong penalty's window (the last ``buffer_length`` tokens before
    ``max_response_length``) does not fit the response budget ``rollout.max_response_tokens``, the
    penalty means something else than the config says. Every stage that rolls out scores with it,
    so :func:`agentrl.config.config_from_args` refuses these at each stage's config load, not only
    the workflow and GRPO (:func:`cross_key_problems`)."""
    overlong, budget = cfg.reward.overlong, cfg.rollout.max_response_tokens
    if not overlong.enable:
        return []
    problems = []
    if overlong.buffer_length > overlong.max_response_length:
        length = f"reward.overlong.max_response_length ({overlong.max_response_length})"
        if overlong.max_response_length == budget:  # null follows the budget: the key the user set is that one
            length = f"the response budget, rollout.max_response_tokens = {length}"
        problems.append(
            f"reward.overlong.buffer_length ({overlong.buffer_length}) exceeds {length}: the penalty would start "
            "before the response does; lower buffer_length, raise the budget or set reward.overlong.enable: false"
        )
    if budget < overlong.max_response_length:
        problems.append(
            f"rollout.max_response_tokens ({budget}) is below reward.overlong.max_response_length "
            f"({overlong.max_response_length}): no response can reach the penalty's full length (at or below "
            "max_response_length - buffer_length it never applies); make them equal (upstream) or turn the "
            "overlong shaping off"
        )
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
    resource (``check_process_counts`` in rules/common.smk), the stage again once its ranks
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
