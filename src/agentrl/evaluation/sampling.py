"""Agentic rollouts of one model on a problem set, graded: the common core of evaluation and filtering.

Both the benchmark evaluation and the RL-pool scoring of the filtering stage do the same thing
with different sampling settings: n multi-turn rollouts per problem with the rollout engine and
agent loop that RL trains with, then the reward registry's verdict on each. Sharing the code is
what makes a pass rate measured here mean the same thing as a reward during RL (docs/recipe.md
section 6: the SFT model's pass rate under the RL rollout setup).

Problems are rolled out in chunks, each with its own seed derived from the stage seed and the
chunk's index, so a run is reproducible for a given config and progress is logged as it goes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.config import Config
from agentrl.data.records import Problem
from agentrl.evaluation.samples import sample_row
from agentrl.progress import progress
from agentrl.rewards import RewardFunction
from agentrl.training.seeds import derived_seed

log = logging.getLogger("agentrl.sampling")


@dataclass(frozen=True)
class SamplingSetup:
    """How many samples per problem and how to draw them; ``seed_tag`` separates stages' streams."""

    n: int
    temperature: float
    top_p: float
    seed: int
    seed_tag: str
    problems_per_chunk: int = 256


def load_tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def graded_sample_rows(
    cfg: Config, model_dir: str, problems: Sequence[Problem], setup: SamplingSetup
) -> Iterator[dict[str, Any]]:
    """Yield one ``samples.jsonl`` row (:func:`agentrl.evaluation.samples.sample_row`) per rollout,
    ordered by problem then sample index."""
    from agentrl.rollout import AgentLoop, SamplingParams, make_engine
    from agentrl.tools.code_interpreter import CodeInterpreter
    from agentrl.tools.sandbox import make_sandbox

    assert problems, "no problems to roll out"
    tokenizer = load_tokenizer(model_dir)
    engine = make_engine(cfg.rollout, model_dir)
    with make_sandbox(cfg.sandbox) as sandbox:
        loop = AgentLoop(engine, tokenizer, CodeInterpreter(sandbox, cfg.tool), cfg.rollout)
        reward_fn = RewardFunction(cfg.reward, sandbox)
        total = len(problems)
        bar = progress(total, setup.seed_tag, unit="problems", logger=log)
        for index, start in enumerate(range(0, total, setup.problems_per_chunk)):
            chunk = list(problems[start : start + setup.problems_per_chunk])
            seed = derived_seed(setup.seed, setup.seed_tag, index)
            params = SamplingParams.from_config(cfg.rollout, seed, temperature=setup.temperature, top_p=setup.top_p)
            trajectories = loop.run(chunk, setup.n, params, seed)
            assert len(trajectories) == len(chunk) * setup.n, (
                f"agent loop returned {len(trajectories)} trajectories for {len(chunk)} problems x n={setup.n}"
            )
            by_id = {p.id: p for p in chunk}
            rewards = reward_fn.score_many(
                [(by_id[t.problem_id], t.text, len(t.response_ids), len(t.tool_calls)) for t in trajectories]
            )
            correct = sum(r.acc for r in rewards)
            log.info(
                "problems %d-%d of %d: %d/%d samples correct",
                start + 1,
                start + len(chunk),
                total,
                correct,
                len(rewards),
            )
            bar.update(len(chunk))
            for trajectory, reward in zip(trajectories, rewards, strict=True):
                yield sample_row(by_id[trajectory.problem_id], trajectory, reward, tokenizer)
        bar.close()
