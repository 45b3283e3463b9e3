"""The reward of a response: route by data source, verify, shape (docs/recipe.md section 4).

``RewardFunction.score_many`` grades a batch in two phases so that the code cases of every
response share one ``Sandbox.run_many`` call (concurrent up to ``sandbox.workers``): each
verifier first lists the programs it needs, then gets their results back. Math and multiple
choice need none and are graded in the calling thread.

A test case the sandbox lost (``ExecutionResult.infra_failure``: a dead worker, a refused or
silent sandbox_fusion service, a queue wait past the limit) is run once more, since a case is a
pure function of its program and input; a case lost again marks the reward ``infra_failure``,
and :func:`leave_out_lost_rewards` marks its trajectory ``infra_failed``, so a lost execution
never becomes the response's score (the agent loop's rule for tool calls, ``agentrl.tools.health``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentrl.config import RewardConfig
from agentrl.data.records import Problem
from agentrl.rewards.base import InvalidGroundTruthError, PendingVerdict, RewardResult, Verdict, Verifier
from agentrl.rewards.registry import VERIFIER_FACTORIES, family_of
from agentrl.rewards.shaping import check_overlong_config, shape

if TYPE_CHECKING:
    from agentrl.data.records import Trajectory
    from agentrl.tools.sandbox import Sandbox

log = logging.getLogger(__name__)

ScoreItem = tuple[Problem, str, int, int]  # (problem, response text, response length in tokens, tool calls)


class RewardFunction:
    """Scores responses to normalized :class:`Problem` s; verifiers are built on first use."""

    def __init__(self, cfg: RewardConfig, sandbox: Sandbox | None = None):
        check_overlong_config(cfg.overlong)
        self.cfg = cfg
        self.sandbox = sandbox
        self._verifiers: dict[str, Verifier] = {}

    def verifier(self, family: str) -> Verifier:
        if family not in self._verifiers:
            self._verifiers[family] = VERIFIER_FACTORIES[family](self.cfg)
        return self._verifiers[family]

    def score(self, problem: Problem, response_text: str, *, response_length: int, num_tool_calls: int) -> RewardResult:
        return self.score_many([(problem, response_text, response_length, num_tool_calls)])[0]

    def score_many(self, items: Sequence[ScoreItem]) -> list[RewardResult]:
        """Score a batch; the code cases of all items run concurrently in the sandbox pool."""
        families = [family_of(problem.data_source, self.cfg.unknown_source) for problem, *_ in items]
        pending = [self._prepare(family, problem, text) for family, (problem, text, *_) in zip(families, items)]
        jobs = [job for entry in pending for job in entry.jobs]
        results: list[Any] = []
        if jobs:
            if self.sandbox is None:
                raise RuntimeError(
                    f"{len(jobs)} code test case(s) to run but RewardFunction was built without a sandbox; "
                    "pass agentrl.tools.factory.make_sandbox(cfg.sandbox)"
                )
            results = self._run_cases(jobs)
        rewards = []
        offset = 0
        for family, entry, (_problem, _text, response_length, num_tool_calls) in zip(families, pending, items):
            verdict = entry.finish(results[offset : offset + len(entry.jobs)])
            offset += len(entry.jobs)
            shaped = shape(
                verdict.score,
                verdict.acc,
                response_length=response_length,
                num_tool_calls=num_tool_calls,
                cfg=self.cfg,
            )
            details = {
                "family": family,
                "raw_score": verdict.score,
                "tool_shaping": shaped.tool_shaping,
                "overlong_penalty": shaped.overlong_penalty,
                **verdict.details,
            }
            lost = any(result.infra_failure for result in results[offset - len(entry.jobs) : offset])
            rewards.append(
                RewardResult(
                    score=shaped.score, acc=verdict.acc, pred=verdict.pred, details=details, infra_failure=lost
                )
            )
        return rewards

    def _run_cases(self, jobs: list[tuple[str, str | None]]) -> list[Any]:
        """Every case's result; the ones the sandbox lost are run once more (the retry's result stands)."""
        limits = {"timeout_s": self.cfg.code_case_timeout_s, "memory_mb": self.cfg.code_case_memory_mb}
        results = list(self.sandbox.run_many(jobs, **limits))
        assert len(results) == len(jobs), f"sandbox returned {len(results)} results for {len(jobs)} programs"
        lost = [index for index, result in enumerate(results) if result.infra_failure]
        if lost:
            log.warning("the sandbox lost %d of %d code test case(s); running them once more", len(lost), len(jobs))
            for index, result in zip(lost, self.sandbox.run_many([jobs[i] for i in lost], **limits)):
                results[index] = result
        return results

    def _prepare(self, family: str, problem: Problem, text: str) -> PendingVerdict:
        try:
            return self.verifier(family).prepare(text, problem.ground_truth)
        except InvalidGroundTruthError as exc:
            if self.cfg.invalid_ground_truth == "score":
                # upstream's compute_score turns the grader's exception into -1 and trains on;
                # check_correctness scores a count mismatch 0.0 without raising (then no shaping)
                details = {"error": f"invalid_ground_truth: {exc}"}
                return PendingVerdict.ready(Verdict(score=exc.upstream_score, acc=False, pred=None, details=details))
            raise InvalidGroundTruthError(
                f"problem {problem.id!r} (data_source {problem.data_source!r}): {exc}"
            ) from None


def leave_out_lost_rewards(trajectories: Sequence[Trajectory], rewards: Sequence[RewardResult]) -> None:
    """Mark ``infra_failed`` each trajectory whose reward the sandbox lost (``RewardResult.infra_failure``),
    so the stages leave it out of advantages, pass rates and metrics as one whose tool call it lost."""
    for trajectory, reward in zip(trajectories, rewards, strict=True):
        if reward.infra_failure:
            trajectory.infra_failed = True
