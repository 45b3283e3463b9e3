"""One GRPO step (docs/recipe.md section 5): roll out, reward, advantage, recompute, update, sync.

The loop around the steps is :mod:`agentrl.grpo.trainer`. Per step, as upstream's verl
``RayPPOTrainer.fit`` with the demystify scripts:

1. ``grpo.batch_prompts`` prompts of the RL set (:class:`~agentrl.grpo.prompts.PromptSampler`);
2. ``grpo.n`` agentic rollouts each (:class:`~agentrl.rollout.AgentLoop`, training sampling of
   ``rollout:``) - with dynamic sampling, groups with all-equal rewards are dropped and more
   prompts rolled out, up to ``max_rollout_batches`` rounds;
3. rewards (``agentrl.rewards``), with the overlong penalty when the variant shapes it;
4. group advantages (``algorithm.group_advantages``), broadcast over the loss-mask tokens;
5. old log-probs recomputed by the actor (and reference log-probs for the KL variants) on
   exactly the micro-batches the update will use, so the first mini-batch starts at ratio 1.
   Two deliberate savings skip that forward (identical values for a model without dropout, as
   Qwen3): with ``grpo.old_logprobs`` resolved to ``engine`` (the embedded default: the fp32
   ``hf`` engine sharing the actor's module, no top-p/top-k; see
   :func:`agentrl.grpo.policy.old_logprobs_source`) the engine's sampling log-probs are the old
   ones; with one PPO epoch over a single mini-batch the update's own forward runs on the
   sampling weights and micro-batches, so its detached log-probs are. Without the pass the
   sampler-actor mismatch is measured in the first mini-batch's forward (the sampling weights);
6. ``ppo_epochs`` passes over mini-batches of ``mini_batch_prompts`` prompts; each mini-batch
   is cut into micro-batches by token budget, each micro-batch's loss is divided by the
   mini-batch's loss-token count (summed over ranks, divided by the world size: DeepSpeed
   averages gradients over ranks) and back-propagated with ``scale_wrt_gas=False``, then one
   DeepSpeed step. With ``grpo.skip_zero_advantage`` the samples of advantage 0 are counted in
   that denominator but run no forward or backward (:meth:`GrpoStep.trains`);
7. the new weights go to the rollout engine (``Engine.update_weights``: free when the ``hf``
   engine shares the module, an in-memory load for vLLM).

Data parallelism (:mod:`agentrl.grpo.work_sharing`): every rank draws the same prompts; the
ranks share them through a queue in the process group's store (``grpo.rollout_queue: shared``)
or prompt i goes to rank i mod W (``fixed``), a group never spanning ranks, so its advantage needs
no communication; the rollout seeds are not the rank's, so a trajectory is the same on any rank.
Before the update each mini-batch's samples are redistributed to equal token loads
(``grpo.balance_ranks``). The number of mini-batches and of micro-batches per mini-batch is
agreed over the ranks (a rank with fewer pads with an empty micro-batch of zero loss), because
the gradient reduction inside ``backward``/``step`` is collective.

Tool-response tokens have loss mask 0, so they never enter the loss, but they count in the
response length that the overlong penalty sees (as upstream).

A trajectory whose retry still lost a tool call to the sandbox (``Trajectory.infra_failed``,
:mod:`agentrl.tools.health`) is left out: its group's advantages are computed without it
(``algorithm.masked_group_advantages``), it has no loss token, it does not make a group
uniform for dynamic sampling, and the ``rollout/`` metrics do not count it (``tool_health/``
does). The agent loop's bound stops the step when too many are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from agentrl.config import Config, ConfigError, process_count_problems
from agentrl.grpo import algorithm as alg
from agentrl.grpo.batching import (
    MicroBatch,
    MiniBatchPlan,
    PolicySample,
    collate,
    pack_micro_batches,
    pack_prompt_groups,
    pack_token_budget,
    prompt_groups,
    unpad_response,
)
from agentrl.grpo.collection import Group, RolloutCollector
from agentrl.grpo.distributed import all_gather, all_reduce, step_with_grad_norm
from agentrl.grpo.metrics import TokenWeightedStats, TrajectorySummary, rollout_metrics
from agentrl.grpo.policy import engine_weights
from agentrl.grpo.variants import AlgorithmSettings
from agentrl.grpo.work_sharing import (
    GroupKey,
    SampleInfo,
    distribute,
)
from agentrl.tools.health import ToolUse, tool_health
from agentrl.training.deepspeed_engine import DistributedContext

if TYPE_CHECKING:  # the heavy imports stay out of a step's module import
    from deepspeed import DeepSpeedEngine

    from agentrl.grpo.policy import ResponseLogProbs
    from agentrl.grpo.rollout_process import RolloutPeer, RolloutProcess
    from agentrl.rewards import RewardFunction
    from agentrl.rollout import AgentLoop, Engine

log = logging.getLogger("agentrl.grpo")


@dataclass
class Components:
    """What a step works with (built by :func:`agentrl.grpo.trainer.build_components`)."""

    cfg: Config
    settings: AlgorithmSettings
    ctx: DistributedContext
    engine: DeepSpeedEngine  # around the actor, a ResponseLogProbs of the policy
    reference: ResponseLogProbs | None  # of the frozen initial policy (KL variants)
    rollout_engine: Engine  # generates with the actor's weights (pushed after each update)
    loop: AgentLoop
    reward_fn: RewardFunction
    pad_token_id: int
    # grpo.old_logprobs resolved (agentrl.grpo.policy.old_logprobs_source): "engine" = the
    # sampling log-probs are the old log-probs, "recompute" = the actor's forward gives them.
    old_logprobs: str = "recompute"
    # grpo.placement separate: the rollout process (agentrl.grpo.rollout_process), which then
    # rolls out, grades and validates in place of rollout_engine, loop and reward_fn (None)
    rollout_process: RolloutProcess | RolloutPeer | None = None


class GrpoStep:
    """One training step; :meth:`run` returns the step's metrics (identical on every rank)."""

    def __init__(self, parts: Components) -> None:
        self.parts = parts
        self.cfg = parts.cfg
        self.grpo = parts.cfg.grpo
        self.settings = parts.settings
        self.ctx = parts.ctx
        problems = process_count_problems(self.grpo, self.ctx.world_size)
        if problems:
            raise ConfigError("; ".join(problems))
        self.collector = RolloutCollector(parts.cfg, parts.ctx, parts.loop, parts.reward_fn)

    def collect(self, step: int, sampler) -> tuple[list[Group], dict[str, float]]:
        """This rank's graded groups of the step and the rollout's metrics (:class:`RolloutCollector`,
        or the rollout process's answer, whose prompt sampler state ``sampler`` takes over)."""
        if self.parts.rollout_process is None:
            return self.collector.collect(step, sampler)
        result = self.parts.rollout_process.rollouts(step)
        sampler.load_state_dict(result.sampler_state)
        return result.groups, result.timing

    # ------------------------------------------------------------------ batch preparation
    def advantages(self, groups: Sequence[Group]) -> list[list[float]]:
        out = []
        for group in groups:
            rewards = torch.tensor(group.scores, dtype=torch.float64)
            norm = self.settings.norm_adv_by_std
            if all(group.valid):
                adv = alg.group_advantages(rewards, len(group.scores), norm_by_std=norm)
            else:
                valid = torch.tensor(group.valid)
                adv = alg.masked_group_advantages(rewards, len(group.scores), valid, norm_by_std=norm)
            out.append(adv.tolist())
        return out

    @property
    def skips_zero_advantage(self) -> bool:
        """Whether samples of advantage 0 skip the update's forward and backward.

        Exact where the loss of such a sample is 0 for every token and its only other part in the
        update is the mini-batch's denominator: the policy-gradient term is ``-A * clip(ratio)``
        (dual clip included) = 0 at ``A = 0``; a KL or entropy term would give it a gradient, and
        ``micro_batch_share`` divides by each micro-batch's own counts."""
        s = self.settings
        return (
            self.grpo.skip_zero_advantage
            and s.kl_coef == 0
            and s.entropy_coef == 0
            and self.grpo.loss_weighting == "mini_batch_tokens"
        )

    def trains(self, sample: PolicySample) -> bool:
        """Whether ``sample``'s forward and backward can change the update."""
        if not self.skips_zero_advantage:
            return True
        return sample.advantage != 0.0 and sample.num_loss_tokens > 0

    def mini_batches(self, num_groups: int) -> list[list[int]]:
        """This rank's sample indices per mini-batch: ``mini_batch_prompts / W`` groups each."""
        n, per_mini = self.grpo.n, self.grpo.mini_batch_prompts // self.ctx.world_size
        return [
            list(range(start * n, min(start + per_mini, num_groups) * n)) for start in range(0, num_groups, per_mini)
        ]

    def distribute(
        self, samples: list[PolicySample], keys: Sequence[GroupKey]
    ) -> tuple[list[PolicySample], list[list[int]]]:
        """The update's mini-batches over the ranks; returns this rank's samples and its
        mini-batches (indices into them).

        ``samples`` are this rank's, ``n`` per group, group k with key ``keys[k]``. All ranks'
        groups in key order make the step; mini-batch m is groups ``m * mini_batch_prompts`` on.
        Each mini-batch's samples (or whole prompt groups with ``share_prompts``) then go to the
        ranks as :func:`~agentrl.grpo.work_sharing.assign_units` says: to equal trained-token
        loads and counts with ``grpo.balance_ranks`` (upstream's ``balance_batch``), else group k
        of the mini-batch to rank k mod W. Advantages were computed before, per group."""
        n, ctx = self.grpo.n, self.ctx
        assert len(samples) == len(keys) * n, f"{len(samples)} samples for {len(keys)} groups x n={n}"
        step_keys = sorted(k for rank_keys in all_gather(ctx, list(keys)) for k in rank_keys)
        per_mini = self.grpo.mini_batch_prompts
        mini_groups = [step_keys[start : start + per_mini] for start in range(0, len(step_keys), per_mini)]
        local = {(key, i): samples[g * n + i] for g, key in enumerate(keys) for i in range(n)}
        infos = [
            SampleInfo(key, i, len(sample.input_ids) if self.trains(sample) else 0)
            for (key, i), sample in local.items()
        ]
        balance = self.grpo.balance_ranks
        per_mini_samples = distribute(ctx, local, infos, mini_groups, by_group=self.grpo.share_prompts, balance=balance)
        mine = [sample for mini in per_mini_samples for sample in mini]
        starts = [sum(len(m) for m in per_mini_samples[:i]) for i in range(len(per_mini_samples))]
        return mine, [list(range(start, start + len(m))) for start, m in zip(starts, per_mini_samples)]

    def plan(
        self, num_groups: int, samples: Sequence[PolicySample], minis: list[list[int]] | None = None
    ) -> list[MiniBatchPlan]:
        """Mini-batches (by prompt groups: :meth:`mini_batches`, or ``minis``) of micro-batches
        (by token budget) of the sample indices that train (:meth:`trains`), with the counts
        agreed over the ranks; an empty micro-batch is ``[]``."""
        minis = self.mini_batches(num_groups) if minis is None else minis
        num_minis = int(all_reduce(self.ctx, len(minis), "max"))
        plan = []
        for m in range(num_minis):
            members = minis[m] if m < len(minis) else []
            trained = [i for i in members if self.trains(samples[i])]
            if m == 0 and not trained:
                # The sampler-actor mismatch is measured on the first mini-batch's forward: it
                # runs even when nothing in it has a gradient (the update is the same).
                trained = members
            micro = self._micro_batches(samples, trained)
            count = int(all_reduce(self.ctx, max(len(micro), 1), "max"))
            plan.append(MiniBatchPlan(members, micro + [[] for _ in range(count - len(micro))]))
        return plan

    @property
    def packs(self) -> bool:
        """Whether micro-batches are packed rows (``grpo.packing``; shared prompts keep their padded forward)."""
        return self.grpo.packing and not self.grpo.share_prompts

    def _micro_batches(self, samples: Sequence[PolicySample], indices: list[int]) -> list[list[int]]:
        """``indices`` cut to ``grpo.micro_batch_tokens``: by whole prompt groups when they share
        the prompt's forward (``grpo.share_prompts``), else by sample, in real tokens when packed
        (:meth:`packs`) and in padded tokens otherwise."""
        budget = self.grpo.micro_batch_tokens
        if self.grpo.share_prompts:
            groups = prompt_groups(samples, indices)
            prompt_lengths = [samples[g[0]].prompt_length for g in groups]
            response_lengths = {i: samples[i].response_length for i in indices}
            return pack_prompt_groups(groups, prompt_lengths, response_lengths, budget)
        lengths = [len(samples[i].input_ids) for i in indices]
        packer = pack_token_budget if self.packs else pack_micro_batches
        return [[indices[j] for j in group] for group in packer(lengths, budget)]

    def micro_batch(self, samples: Sequence[PolicySample], indices: list[int]) -> MicroBatch:
        if not indices:  # padding micro-batch of a rank with fewer: one masked token, zero loss
            empty = PolicySample(
                [self.parts.pad_token_id] * 2,
                1,
                [0],
                [0.0],
                0.0,
                old_logp=[0.0],
                ref_logp=[0.0] if self.settings.uses_reference else None,
            )
            return collate([empty], self.parts.pad_token_id, packed=self.packs).to(self.ctx.device)
        chosen = [samples[i] for i in indices]
        batch = collate(chosen, self.parts.pad_token_id, share_prompts=self.grpo.share_prompts, packed=self.packs)
        return batch.to(self.ctx.device)

    def single_pass(self, plan) -> bool:
        """One PPO epoch over one mini-batch: the update's forward runs on the weights that the
        recomputation would use, on the same micro-batches, so its detached log-probs *are* the
        old log-probs and the separate pass is skipped (exact for a model without dropout)."""
        return self.grpo.ppo_epochs == 1 and len(plan) == 1

    def recomputes_old(self, plan) -> bool:
        """Whether :meth:`recompute_logprobs` runs the actor for the old log-probs."""
        return self.parts.old_logprobs == "recompute" and not self.single_pass(plan)

    @staticmethod
    def _add_mismatch(stats: TokenWeightedStats, logp: torch.Tensor, batch: MicroBatch) -> None:
        """How far the actor's log-probs are from the rollout engine's for the same tokens."""
        mask = batch.loss_mask
        diff = logp.detach().float() - batch.sampling_logp
        stats.add(
            {
                "rollout/logp_mismatch_abs": float(alg.masked_mean(diff.abs(), mask)),
                # KL(sampler || actor) on the sampler's tokens, k3 estimator.
                "rollout/logp_mismatch_kl_k3": float(alg.masked_mean(torch.expm1(-diff) + diff, mask)),
            },
            float(mask.sum()),
            maxima={"rollout/logp_mismatch_abs_max": float(torch.where(mask.bool(), diff.abs(), 0).max())},
        )

    @torch.no_grad()
    def recompute_logprobs(self, samples: Sequence[PolicySample], plan) -> dict[str, float]:
        """old_logp by the actor (unless :meth:`single_pass`, or the engine's sampling log-probs
        where they are exact) and ref_logp, on the update's own micro-batches; returns the
        mismatch statistics' state."""
        actor = self.parts.engine.module
        recompute_old = self.recomputes_old(plan)
        if self.parts.old_logprobs == "engine":
            for sample in samples:  # 0.0 where the mask is 0: those positions never enter the loss
                sample.old_logp = list(sample.sampling_logp)
        stats = TokenWeightedStats()
        if not recompute_old and self.parts.reference is None:
            return stats.state()
        actor.eval()
        try:
            for micro in (mb for mini in plan for mb in mini.micro_batches if mb):
                chosen = [samples[i] for i in micro]
                batch = self.micro_batch(samples, micro)
                if recompute_old:
                    # The entropy statistic comes from this no-grad pass when no loss term needs it.
                    logp, entropy = actor(batch, with_entropy=self.settings.entropy_coef == 0)
                    for sample, row in zip(chosen, unpad_response(logp, chosen)):
                        sample.old_logp = row
                    self._add_mismatch(stats, logp, batch)
                    if entropy is not None:
                        stats.add(
                            {"actor/entropy": float(alg.masked_mean(entropy, batch.loss_mask))},
                            float(batch.loss_mask.sum()),
                        )
                if self.parts.reference is not None:
                    ref_logp, _ = self.parts.reference(batch)
                    for sample, row in zip(chosen, unpad_response(ref_logp, chosen)):
                        sample.ref_logp = row
        finally:
            actor.train()
        return stats.state()

    # ------------------------------------------------------------------ update
    def update(self, samples: Sequence[PolicySample], plan) -> tuple[dict[str, Any], list[float], list[float]]:
        """ppo_epochs passes of mini-batch updates; returns (stat state, grad norms, lrs)."""
        engine, ctx = self.parts.engine, self.ctx
        stats = TokenWeightedStats()
        grad_norms, lrs = [], []
        # Without the recomputation the first mini-batch's forward runs on the sampling weights.
        measure_mismatch = not self.recomputes_old(plan)
        for epoch in range(self.grpo.ppo_epochs):
            for mini_index, mini in enumerate(plan):
                chosen = mini.members  # the denominators count the samples that skip the update too
                local_tokens = sum(samples[i].num_loss_tokens for i in chosen)
                local_seqs = sum(samples[i].num_loss_tokens > 0 for i in chosen)
                # DeepSpeed averages gradients over ranks, so each rank divides by the all-rank count / W.
                token_count = max(all_reduce(ctx, local_tokens), 1.0) / ctx.world_size
                seq_count = max(all_reduce(ctx, local_seqs), 1.0) / ctx.world_size
                # grpo.loss_weighting: micro_batch_share weighs each micro-batch's own aggregate by
                # its share of a rank's sequences of the mini-batch (upstream: ppo_mini_batch_size per GPU)
                mini_seqs = max(all_reduce(ctx, len(chosen)), 1.0) / ctx.world_size
                mini_loss = 0.0  # the sum of the micro-batch losses is the mini-batch loss
                for position, micro in enumerate(mini.micro_batches):
                    # The last micro-batch is the boundary: DeepSpeed reduces the gradients there.
                    engine.set_gradient_accumulation_boundary(position == len(mini.micro_batches) - 1)
                    batch = self.micro_batch(samples, micro)
                    counts = (token_count, seq_count, 1.0)
                    if self.grpo.loss_weighting == "micro_batch_share":
                        counts = (None, None, alg.micro_batch_share(len(micro), mini_seqs))
                    # Without the recomputation pass the first mini-batch (on the sampling weights) logs
                    # the entropy, as the sampler-actor mismatch, without gradient.
                    sampled = measure_mismatch and epoch == 0 and mini_index == 0
                    loss, micro_stats, logp = self._micro_loss(batch, *counts, log_entropy=sampled)
                    engine.backward(loss, scale_wrt_gas=False)
                    if sampled and micro:
                        self._add_mismatch(stats, logp, batch)
                    mini_loss += micro_stats.pop("actor/pg_loss")
                    stats.add(
                        micro_stats,
                        float(batch.loss_mask.sum()) if micro else 0.0,
                        maxima={"actor/ratio_max": micro_stats.pop("actor/ratio_max")},
                    )
                # Mean over ranks of each rank's part (S_rank * W / N) is the mini-batch loss S / N.
                stats.add({"actor/pg_loss": mini_loss}, 1.0)
                lrs.append(float(engine.get_lr()[0]))
                grad_norms.append(step_with_grad_norm(engine))
        return stats.state(), grad_norms, lrs

    def _micro_loss(
        self, batch: MicroBatch, token_count: float | None, seq_count: float | None, share: float, log_entropy: bool
    ):
        """(loss to back-propagate, statistics, detached log-probs) of one micro-batch.

        The counts are the mini-batch's (None: this micro-batch's own); the loss is scaled by
        ``share``. The vocabulary-wide entropy is computed only for an entropy term
        (``entropy_coef > 0``) or, without gradient, when ``log_entropy`` asks for the statistic."""
        settings = self.settings
        counts = {"global_token_count": token_count, "global_seq_count": seq_count}
        with_entropy = settings.entropy_coef > 0 or log_entropy
        logp, entropy = self.parts.engine(batch, with_entropy=with_entropy, entropy_grad=settings.entropy_coef > 0)
        old_logp = batch.old_logp if batch.old_logp is not None else logp.detach()
        correction = {}
        if self.grpo.max_staleness > 0:  # decoupled PPO: old_logp is the proximal policy, the engine's the behaviour
            cap = self.grpo.behaviour_weight_cap
            weight = alg.behaviour_importance_weight(
                old_logp, batch.sampling_logp, batch.loss_mask, cap=cap, level=settings.ratio_level
            )
            correction = {"behaviour_weight": weight, "behaviour_weight_cap": cap}
        pg_loss, pg_stats = alg.policy_loss(
            logp,
            old_logp,
            batch.advantages,
            batch.loss_mask,
            clip_low=settings.clip_low,
            clip_high=settings.clip_high,
            clip_c=settings.clip_c,
            ratio_level=settings.ratio_level,
            agg_mode=settings.loss_agg_mode,
            **counts,
            **correction,
        )
        loss = pg_loss
        stats = {f"actor/{k}": float(v) for k, v in pg_stats.items()}
        mask = batch.loss_mask
        if settings.kl_coef > 0:
            kl = alg.kl_penalty(logp, batch.ref_logp, kind=settings.kl_estimator)
            kl_loss = alg.aggregate_loss(kl, mask, mode=settings.loss_agg_mode, **counts)
            loss = loss + settings.kl_coef * kl_loss
            stats["actor/kl_ref"] = float(alg.masked_mean(kl.detach(), mask))
        if settings.entropy_coef > 0:
            entropy_loss = alg.aggregate_loss(entropy, mask, mode=settings.loss_agg_mode, **counts)
            loss = loss - settings.entropy_coef * entropy_loss
        if entropy is not None:
            stats["actor/entropy"] = float(alg.masked_mean(entropy.detach(), mask))
        stats["actor/pg_loss"] = float(pg_loss.detach()) * share  # this micro-batch's part of the mini-batch loss
        return loss * share, stats, logp.detach()

    # ------------------------------------------------------------------ the step
    def samples(self, groups: Sequence[Group], advantages: Sequence[Sequence[float]]) -> list[PolicySample]:
        """One sample per trajectory, groups contiguous (the mini-batch split relies on it); one
        left out for an infrastructure failure keeps its place with no loss token."""
        samples = []
        for g, adv in zip(groups, advantages):
            for t, a in zip(g.trajectories, adv):
                sample = PolicySample.from_trajectory(t, a)
                if t.infra_failed:
                    sample.loss_mask = [0] * len(sample.loss_mask)
                samples.append(sample)
        return samples

    def push_weights(self, step: int) -> None:
        """The updated weights to the rollout engine, or to the rollout process as version ``step``."""
        if self.parts.rollout_process is not None:
            self.parts.rollout_process.publish(step)
        else:
            policy = self.parts.engine.module.model
            self.parts.rollout_engine.update_weights(engine_weights(policy, self.cfg.rollout))

    def run(self, step: int, sampler) -> dict[str, Any]:
        started = time.perf_counter()
        groups, rollout_timing = self.collect(step, sampler)
        advantages = self.advantages(groups)
        samples, minis = self.distribute(self.samples(groups, advantages), [g.key for g in groups])
        plan = self.plan(len(groups), samples, minis)

        if self.parts.rollout_engine is not None:
            self.parts.rollout_engine.sleep()  # its memory to the trainer until the weights are pushed
        t0 = time.perf_counter()
        mismatch = self.recompute_logprobs(samples, plan)
        t1 = time.perf_counter()
        update_stats, grad_norms, lrs = self.update(samples, plan)
        t2 = time.perf_counter()
        self.push_weights(step)
        t3 = time.perf_counter()

        summaries = [
            TrajectorySummary(
                len(t.response_ids),
                sum(t.loss_mask),
                t.num_turns,
                len(t.tool_calls),
                sum(t.tool_errors),
                t.finish_reason,
                s,
                a,
                o,
                adv,
                g.problem.data_source,
            )
            for g, advs in zip(groups, advantages)
            for t, s, a, o, adv in zip(g.trajectories, g.scores, g.accs, g.overlong_penalties, advs)
            if not t.infra_failed
        ]
        gathered = all_gather(
            self.ctx,
            {
                "summaries": summaries,
                "tool_use": [ToolUse.of(t) for g in groups for t in g.trajectories],
                "update": update_stats,
                "mismatch": mismatch,
                "loss_tokens": sum(s.num_loss_tokens for s in samples),
                "samples": len(samples),
                "trained": len(trained := [i for mini in plan for micro in mini.micro_batches for i in micro]),
                "input_tokens": sum(len(samples[i].input_ids) for i in trained) * self.grpo.ppo_epochs,
            },
        )
        record: dict[str, Any] = {"step": step, "epoch": sampler.progress}
        record.update(
            rollout_metrics(
                [s for g in gathered for s in g["summaries"]], max_response_tokens=self.cfg.rollout.max_response_tokens
            )
        )
        record.update(tool_health([u for g in gathered for u in g["tool_use"]], prefix="tool_health/"))
        record.update(TokenWeightedStats.merge(g["mismatch"] for g in gathered))
        record.update(TokenWeightedStats.merge(g["update"] for g in gathered))
        record.update(
            {
                "actor/grad_norm": sum(grad_norms) / max(len(grad_norms), 1),
                "actor/grad_norm_max": max(grad_norms, default=0.0),
                "actor/lr": lrs[-1] if lrs else 0.0,
                "actor/optimizer_steps": float(len(grad_norms)),
                "actor/loss_tokens": float(sum(g["loss_tokens"] for g in gathered)),
                "actor/input_tokens": float(sum(g["input_tokens"] for g in gathered)),
                # the share of samples that ran forward and backward (the rest: advantage 0, skipped)
                "actor/trained_share": sum(g["trained"] for g in gathered)
                / max(sum(g["samples"] for g in gathered), 1),
                **rollout_timing,
                "timing/old_logp_s": t1 - t0,
                "timing/update_s": t2 - t1,
                "timing/weight_sync_s": t3 - t2,
                "timing/step_s": t3 - started,
            }
        )
        # Prompt + response tokens of the trained samples through forward and backward per second
        # of update, all ranks.
        record["timing/train_tokens_per_s"] = record["actor/input_tokens"] / max(t2 - t1, 1e-9)
        return record
