"""The reward of a response: route by data source, verify, shape (docs/recipe.md section 4).

``RewardFunction.score_many`` grades a batch in two phases so that the code cases of every
response share one ``Sandbox.run_many`` call (concurrent up to ``sandbox.workers``): each
verifier first lists the programs it needs, then gets their results back. Math and multiple
choice need none and are graded in the calling thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentrl.config import RewardConfig
from agentrl.data.records import Problem
from agentrl.rewards.base import InvalidGroundTruthError, PendingVerdict, RewardResult, Verdict, Verifier
from agentrl.rewards.registry import VERIFIER_FACTORIES, family_of
from agentrl.rewards.shaping import check_overlong_config, shape

if TYPE_CHECKING:
    from agentrl.tools.sandbox import Sandbox

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
                    "pass agentrl.tools.sandbox.make_sandbox(cfg.sandbox)"
                )
            results = list(
                self.sandbox.run_many(
                    jobs, timeout_s=self.cfg.code_case_timeout_s, memory_mb=self.cfg.code_case_memory_mb
                )
            )
            assert len(results) == len(jobs), f"sandbox returned {len(results)} results for {len(jobs)} programs"
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
            rewards.append(RewardResult(score=shaped.score, acc=verdict.acc, pred=verdict.pred, details=details))
        return rewards

    def _prepare(self, family: str, problem: Problem, text: str) -> PendingVerdict:
        try:
            return self.verifier(family).prepare(text, problem.ground_truth)
        except InvalidGroundTruthError as exc:
            if self.cfg.invalid_ground_truth == "score":
                # upstream's compute_score turns the grader's exception into -1 and trains on
                details = {"error": f"invalid_ground_truth: {exc}"}
                return PendingVerdict.ready(Verdict(score=-1.0, acc=False, pred=None, details=details))
            raise InvalidGroundTruthError(
                f"problem {problem.id!r} (data_source {problem.data_source!r}): {exc}"
            ) from None
