"""Agentic rollouts of one model on a problem set, graded: the common core of evaluation and filtering.

Both the benchmark evaluation and the RL-pool scoring of the filtering stage do the same thing
with different sampling settings: n multi-turn rollouts per problem with the rollout engine and
agent loop that RL trains with, then the reward registry's verdict on each. Sharing the code is
what makes a pass rate measured here mean the same thing as a reward during RL (docs/recipe.md
section 6: the SFT model's pass rate under the RL rollout setup).

Seeds: every rollout is seeded by (global seed, stage tag, problem id, sample index) and its turn
(:func:`agentrl.rollout.agent_loop.turn_seed`), never by a position in a chunk or a shard, and
the ``hf`` engine samples each sequence from its own seed; so a problem's samples are the same
whichever problems share its batch, and the scoring and evaluation shards gather into the same
files for any shard count. At most ``problems_per_chunk`` problems are in flight at once (bounded
memory), the next one starting as soon as one ends (:meth:`AgentLoop.stream`: no chunk waits
for its slowest sample), and each is handed over as its last rollout ends, for the shard file
to write.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.config import Config
from agentrl.data.records import Problem
from agentrl.progress import progress
from agentrl.rewards import RewardFunction, leave_out_lost_rewards
from agentrl.sampling.samples import sample_row
from agentrl.training.seeds import derived_seed

log = logging.getLogger("agentrl.sampling")

# Problems rolled out at once by a scoring or evaluation job: each holds n trajectories' contexts
# (and, in vLLM, KV blocks) while in flight, so this bounds memory; 256 keeps a GPU's batch full
# at paper scale (n = 8 to 32 samples each) and costs nothing on CPU.
PROBLEMS_IN_FLIGHT = 256


@dataclass(frozen=True)
class SamplingSetup:
    """How many samples per problem and how to draw them; ``seed_tag`` separates stages' streams."""

    n: int
    temperature: float
    top_p: float
    seed: int
    seed_tag: str
    problems_per_chunk: int = PROBLEMS_IN_FLIGHT  # problems in flight at once
    reasoning: str = "agentic"  # or "self_contained": no tool schema, no tool turns (eval.reasoning)


def load_tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def grade_problems(
    cfg: Config,
    model_dir: str,
    problems: Sequence[Problem],
    setup: SamplingSetup,
    on_problem: Callable[[Problem, list[dict[str, Any]]], None],
) -> None:
    """Roll out and grade ``setup.n`` samples of every problem; ``on_problem(problem, rows)`` gets
    each problem's ``samples.jsonl`` rows (:func:`agentrl.sampling.samples.sample_row`, by sample
    index) as soon as its rollouts are done, in the order problems finish.

    ``setup.reasoning`` ``self_contained``: each problem's user messages lose their tool sentences
    (:func:`agentrl.data.prompts.self_contained_messages`) and the agent loop has no tool; the
    sandbox still grades code answers.
    """
    from agentrl.data.prompts import self_contained_messages
    from agentrl.rollout import AgentLoop, SamplingParams, make_engine
    from agentrl.tools.code_interpreter import CodeInterpreter
    from agentrl.tools.factory import make_sandbox
    from agentrl.tools.health import InfraFailureBound, ToolUse, tool_health

    assert problems, "no problems to roll out"
    assert setup.reasoning in ("agentic", "self_contained"), f"unknown reasoning {setup.reasoning!r}"
    agentic = setup.reasoning == "agentic"
    if not agentic:
        problems = [dataclasses.replace(p, prompt=self_contained_messages(p.prompt)) for p in problems]
    tokenizer = load_tokenizer(model_dir)
    engine = make_engine(cfg.rollout, model_dir)  # standalone: rollout.vllm.gpu_memory_utilization
    seed = derived_seed(setup.seed, setup.seed_tag)
    params = SamplingParams.from_config(cfg.rollout, seed, temperature=setup.temperature, top_p=setup.top_p)
    with make_sandbox(cfg.sandbox) as sandbox:
        loop = AgentLoop(
            engine,
            tokenizer,
            CodeInterpreter(sandbox, cfg.tool) if agentic else None,
            cfg.rollout,
            InfraFailureBound.from_config(cfg.sandbox),
            tools=agentic,
        )
        reward_fn = RewardFunction(cfg.reward, sandbox)
        total, done, correct = len(problems), 0, 0
        bar = progress(total, setup.seed_tag, unit="problems", logger=log)

        def grade(trajectories):
            nonlocal done, correct
            problem = by_id[trajectories[0].problem_id]
            rewards = reward_fn.score_many(
                [(problem, t.text, len(t.response_ids), len(t.tool_calls)) for t in trajectories]
            )
            leave_out_lost_rewards(trajectories, rewards)
            on_problem(
                problem, [sample_row(problem, t, r, tokenizer) for t, r in zip(trajectories, rewards, strict=True)]
            )
            done, correct = done + 1, correct + sum(r.acc for r in rewards)
            tool_use.extend(ToolUse.of(t) for t in trajectories)
            bar.set_postfix(correct=f"{correct}/{done * setup.n}")
            bar.update(1)

        by_id = {p.id: p for p in problems}
        tool_use: list[ToolUse] = []  # the latencies, which the sample rows leave out
        loop.stream(problems, setup.n, params, seed, grade, max_problems_in_flight=setup.problems_per_chunk)
        assert done == total, f"the agent loop handed over {done} of {total} problems"
        bar.close()
        health = tool_health(tool_use)
        log.info(
            "%s tool latency: queue p50 %.3f s p95 %.3f s, run p50 %.3f s p95 %.3f s over %d calls",
            setup.seed_tag,
            health["queue_s_p50"],
            health["queue_s_p95"],
            health["run_s_p50"],
            health["run_s_p95"],
            health["calls"],
        )
