"""Validation during GRPO: avg@n on each eval set, with the validation sampling settings.

Upstream (verl ``_validate``) samples n responses per validation problem (paper: 32, temperature
1.0, top_p 0.6) and logs the mean accuracy per data source. Here each rank rolls out its share
of every set with the trainer's own rollout engine and agent loop (the current weights), the
reward registry grades them, and rank 0 reduces to ``val/<set>/avg@<n>`` (mean over problems
of the share of correct samples, ``agentrl.sampling.metrics.avg_at_k``) and
``val/mean/avg@<n>`` (mean over the sets). The sampling seed of a set is the same at every
validation (common random numbers), so the change between two validations is the model's, not
the sampler's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentrl.config import Config, RolloutConfig
from agentrl.data.prompt_fit import fit_problems
from agentrl.data.records import Problem
from agentrl.grpo.distributed import all_gather
from agentrl.rewards import RewardFunction, leave_out_lost_rewards
from agentrl.rollout import AgentLoop, SamplingParams
from agentrl.sampling.metrics import avg_at_k
from agentrl.training.deepspeed_engine import DistributedContext
from agentrl.training.seeds import derived_seed

log = logging.getLogger("agentrl.grpo")


@dataclass(frozen=True)
class EvalSet:
    name: str
    problems: tuple[Problem, ...]


def validate(
    cfg: Config,
    loop: AgentLoop,
    reward_fn: RewardFunction,
    eval_sets: Sequence[EvalSet],
    ctx: DistributedContext,
) -> dict[str, float]:
    """Validation metrics (``val/...``), identical on every rank."""
    setup = cfg.grpo.validation
    n = setup.n
    metrics: dict[str, float] = {}
    for eval_set in eval_sets:
        local = list(eval_set.problems[ctx.rank :: ctx.world_size])
        seed = derived_seed(cfg.seed, f"grpo-val-{eval_set.name}", ctx.rank)
        rows: list[tuple[str, list[float], list[int], list[int], bool]] = []
        if local:
            params = SamplingParams.from_config(cfg.rollout, seed, temperature=setup.temperature, top_p=setup.top_p)
            trajectories = loop.run(local, n, params, seed)
            by_id = {p.id: p for p in local}
            results = reward_fn.score_many(
                [(by_id[t.problem_id], t.text, len(t.response_ids), len(t.tool_calls)) for t in trajectories]
            )
            leave_out_lost_rewards(trajectories, results)
            for start in range(0, len(trajectories), n):
                group = trajectories[start : start + n]
                rows.append(
                    (
                        group[0].problem_id,
                        [float(r.acc) for r in results[start : start + n]],
                        [len(t.response_ids) for t in group],
                        [len(t.tool_calls) for t in group],
                        any(t.infra_failed for t in group),
                    )
                )
        gathered = [row for rank_rows in all_gather(ctx, rows) for row in rank_rows]
        assert len(gathered) == len(eval_set.problems), (
            f"validation of {eval_set.name}: {len(gathered)} problems graded, {len(eval_set.problems)} expected"
        )
        # A problem with a trajectory lost to the sandbox is left out whole, as evaluation does
        # (agentrl.tools.health); the agent loop's bound stops the step when too many are.
        lost = sum(row[4] for row in gathered)
        gathered = [row for row in gathered if not row[4]]
        if not gathered:
            raise RuntimeError(
                f"validation of {eval_set.name}: every problem has a trajectory whose tool call the sandbox lost "
                "twice; nothing is left to validate on (sandbox.max_infra_failure_share is 1: nothing stopped it)"
            )
        correct = np.asarray([accs for _, accs, _, _, _ in gathered])  # (problems, n)
        metrics[f"val/{eval_set.name}/avg@{n}"] = avg_at_k(correct)
        metrics[f"val/{eval_set.name}/response_length_mean"] = float(
            np.mean([x for _, _, ls, _, _ in gathered for x in ls])
        )
        metrics[f"val/{eval_set.name}/tool_calls_mean"] = float(np.mean([x for _, _, _, cs, _ in gathered for x in cs]))
        if lost:
            metrics[f"val/{eval_set.name}/problems_left_out"] = float(lost)
    if eval_sets:
        metrics[f"val/mean/avg@{n}"] = float(np.mean([metrics[f"val/{s.name}/avg@{n}"] for s in eval_sets]))
    return metrics


def limit_problems(problems: Sequence[Problem], max_problems: int | None) -> tuple[Problem, ...]:
    return tuple(problems if max_problems is None else problems[:max_problems])


def fit_eval_sets(eval_sets: Sequence[EvalSet], tokenizer, rollout: RolloutConfig) -> list[EvalSet]:
    """The sets without prompts over ``rollout.max_prompt_tokens``.

    The eval files were fit to ``eval.max_prompt_tokens``; validation rolls out with the training
    limit, as verl's filter would apply the training script's ``max_prompt_length`` to its
    validation files. The released recipe's dataset filters nothing and raises on a longer prompt
    (``rollout.overlong_prompts: error`` stops the run here too; :mod:`agentrl.data.prompt_fit`).
    """
    fitted = []
    for eval_set in eval_sets:
        kept, counts = fit_problems(
            eval_set.problems,
            tokenizer,
            rollout.max_prompt_tokens,
            rollout.prompt_length_with_tools,
            rollout.overlong_prompts,
        )
        if counts["dropped"]:
            log.info("validation set %s: dropped %s over the prompt limit", eval_set.name, counts["dropped_by_source"])
        fitted.append(EvalSet(eval_set.name, tuple(kept)))
    return fitted
