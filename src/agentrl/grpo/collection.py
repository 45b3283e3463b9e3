"""A GRPO step's rollouts: the round's prompts shared over the ranks, rolled out, graded.

Per round ``grpo.batch_prompts`` prompts (:class:`~agentrl.grpo.prompts.PromptSampler`, the same
on every rank) are rolled out ``grpo.n`` times each by the agent loop with the training sampling
of ``rollout:`` and graded; with dynamic sampling, groups whose rewards are all equal are dropped
and further rounds drawn, up to ``max_rollout_batches``. Which rank rolls out which prompt is
:mod:`agentrl.grpo.work_sharing`'s (``grpo.rollout_queue``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentrl.config import Config
from agentrl.data.records import Problem, Trajectory
from agentrl.grpo.distributed import all_gather, all_reduce
from agentrl.grpo.work_sharing import ClaimQueue, GroupKey, fixed_positions, queue_store, select_groups
from agentrl.rewards.reward_function import leave_out_lost_rewards
from agentrl.training.deepspeed_engine import DistributedContext
from agentrl.training.seeds import derived_seed

if TYPE_CHECKING:
    from agentrl.rewards import RewardFunction
    from agentrl.rollout import AgentLoop

log = logging.getLogger("agentrl.grpo")


@dataclass
class Group:
    """The n rollouts of one prompt, graded."""

    problem: Problem
    trajectories: list[Trajectory]
    scores: list[float]
    accs: list[bool]
    overlong_penalties: list[float]
    key: GroupKey = (0, 0)  # (rollout round, position in the round's prompts): its place in the step

    @property
    def valid(self) -> list[bool]:
        """Per trajectory: not lost to an infrastructure failure (:mod:`agentrl.tools.health`)."""
        return [not t.infra_failed for t in self.trajectories]

    @property
    def uniform(self) -> bool:
        scores = [s for s, ok in zip(self.scores, self.valid) if ok]
        return not scores or max(scores) == min(scores)


def rollout_parts(cfg: Config, engine, tokenizer, sandbox) -> tuple[AgentLoop, RewardFunction]:
    """GRPO's agent loop (the code interpreter on ``sandbox``, the infrastructure-failure bound)
    and reward function (overlong shaping as the variant says), as the colocated trainer and the
    rollout process both build them."""
    from agentrl.grpo.variants import grpo_reward_config, resolve_algorithm
    from agentrl.rewards import RewardFunction
    from agentrl.rollout import AgentLoop
    from agentrl.tools.code_interpreter import CodeInterpreter
    from agentrl.tools.health import InfraFailureBound

    interpreter = CodeInterpreter(sandbox, cfg.tool)
    loop = AgentLoop(engine, tokenizer, interpreter, cfg.rollout, InfraFailureBound.from_config(cfg.sandbox))
    return loop, RewardFunction(grpo_reward_config(cfg.reward, resolve_algorithm(cfg.grpo)), sandbox)


class RolloutCollector:
    """Rolls out and grades this rank's share of a step's prompts."""

    def __init__(self, cfg: Config, ctx: DistributedContext, loop: AgentLoop, reward_fn: RewardFunction) -> None:
        self.cfg = cfg
        self.grpo = cfg.grpo
        self.ctx = ctx
        self.loop = loop
        self.reward_fn = reward_fn
        self._queue_store = None  # (store, token) of grpo.rollout_queue: shared, made at the first claim

    def collect(self, step: int, sampler) -> tuple[list[Group], dict[str, float]]:
        """Roll out and grade groups until the step has ``batch_prompts`` of them (dynamic
        sampling: groups that teach); returns this rank's groups of the step in step order.

        Each round draws ``batch_prompts`` prompts (the same on every rank) and the ranks share
        them as ``grpo.rollout_queue`` says (:mod:`agentrl.grpo.work_sharing`); the step's groups
        are the first ``batch_prompts`` kept ones in (round, position) order, whichever rank rolled
        them out. The update redistributes them (:meth:`agentrl.grpo.step.GrpoStep.distribute`)."""
        grpo, ctx = self.grpo, self.ctx
        dynamic = grpo.dynamic_sampling.enable
        kept: list[Group] = []
        timing = {"timing/rollout_s": 0.0, "timing/reward_s": 0.0, "timing/generate_s": 0.0, "timing/tools_s": 0.0}
        rounds = generated = 0
        while True:
            problems = sampler.next_batch(grpo.batch_prompts, grpo.epoch_end)  # the same on every rank
            groups = self.rollout_groups(problems, self.positions(step, rounds, len(problems)), step, rounds, timing)
            generated += len(groups)
            kept += [g for g in groups if not (dynamic and g.uniform)]
            rounds += 1
            if not dynamic or rounds >= grpo.dynamic_sampling.max_rollout_batches:
                break
            if all_reduce(ctx, len(kept)) >= grpo.batch_prompts:
                break
        chosen = set(select_groups(all_gather(ctx, [g.key for g in kept]), grpo.batch_prompts))
        if dynamic and len(chosen) < grpo.batch_prompts:
            log.warning(
                "step %d: dynamic sampling kept %d of %d groups after %d rounds; training on those",
                step,
                len(chosen),
                grpo.batch_prompts,
                rounds,
            )
        mine = sorted((g for g in kept if g.key in chosen), key=lambda g: g.key)
        extra = {
            "rollout/rounds": float(rounds),
            "rollout/groups_generated": all_reduce(ctx, generated),
            # the most groups one rank rolled out, over the step's mean: 1 when the ranks' shares are equal
            "rollout/groups_rank_max_share": all_reduce(ctx, generated, "max")
            * ctx.world_size
            / max(all_reduce(ctx, generated), 1.0),
        }
        return mine, {**timing, **extra}

    def positions(self, step: int, round_: int, size: int) -> Iterable[int]:
        """The positions of the round's prompts this rank rolls out (``grpo.rollout_queue``)."""
        ctx = self.ctx
        if ctx.world_size == 1:
            return range(size)
        if self.grpo.rollout_queue == "fixed":
            return fixed_positions(size, ctx.rank, ctx.world_size)
        if self._queue_store is None:
            self._queue_store = queue_store(ctx)
        store, token = self._queue_store
        return ClaimQueue(store, token, f"step{step}-round{round_}", size)

    @property
    def groups_in_flight(self) -> int | None:
        """The groups one rank rolls out at once (``grpo.queue_groups_in_flight``; None: all it holds)."""
        if self.ctx.world_size == 1 or self.grpo.rollout_queue == "fixed":
            return None
        if self.grpo.queue_groups_in_flight is not None:
            return self.grpo.queue_groups_in_flight
        # Half a fair share: the others can still claim when one rank's first groups run long.
        return max(1, self.grpo.batch_prompts // self.ctx.world_size // 2)

    def rollout_groups(
        self, problems: list[Problem], positions: Iterable[int], step: int, round_: int, timing: dict
    ) -> list[Group]:
        """Roll out and grade the groups of ``problems`` at ``positions`` (taken lazily: a
        :class:`ClaimQueue` hands out the next one as a group in flight ends)."""
        cfg, n = self.cfg, self.grpo.n
        # One seed per step and round on every rank: the turn seeds add the problem, sample and
        # turn, so a trajectory does not depend on the rank that rolls it out.
        seed = derived_seed(cfg.seed, f"grpo-step{step}-round{round_}")
        params = self.sampling_params(seed)
        started = time.perf_counter()
        taken: list[int] = []

        def claimed() -> Iterator[Problem]:
            for position in positions:
                taken.append(position)
                yield problems[position]

        trajectories = self.loop.run_pulled(claimed(), n, params, seed, max_problems_in_flight=self.groups_in_flight)
        stats = self.loop.stats
        timing["timing/rollout_s"] += time.perf_counter() - started
        timing["timing/generate_s"] += stats.generate_s
        timing["timing/tools_s"] += stats.tools_s
        assert len(trajectories) == len(taken) * n, (
            f"agent loop returned {len(trajectories)} trajectories for {len(taken)} prompts x n={n}"
        )
        started = time.perf_counter()
        mine = [problems[position] for position in taken]
        results = self.reward_fn.score_many(
            [
                (p, t.text, len(t.response_ids), len(t.tool_calls))
                for p, t in zip([p for p in mine for _ in range(n)], trajectories)
            ]
        )
        leave_out_lost_rewards(trajectories, results)
        timing["timing/reward_s"] += time.perf_counter() - started
        groups = []
        for index, (position, problem) in enumerate(zip(taken, mine)):
            chunk = slice(index * n, (index + 1) * n)
            trajs, graded = trajectories[chunk], results[chunk]
            assert all(t.problem_id == problem.id for t in trajs), f"trajectories of {problem.id} out of order"
            groups.append(
                Group(
                    problem,
                    trajs,
                    [r.score for r in graded],
                    [bool(r.acc) for r in graded],
                    [float(r.details.get("overlong_penalty", 0.0)) for r in graded],
                    key=(round_, position),
                )
            )
        return groups

    def sampling_params(self, seed: int):
        from agentrl.rollout import SamplingParams

        return SamplingParams.from_config(self.cfg.rollout, seed)
