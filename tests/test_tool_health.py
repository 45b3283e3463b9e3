"""Tool health: every outcome from a real case, the retry of a lost call, its exclusion, the bound.

The cases are real: programs run in the real local sandbox, a worker is killed from outside with
SIGKILL while it runs a program, and the SandboxFusion backend talks HTTP to a local server
(tests/test_sandbox_fusion.py's) that refuses requests; the rollouts are a tiny real model's
(:class:`helpers.rollout.ForceTurns` scripts the turns).
"""

from __future__ import annotations

import itertools
import os
import signal
import threading

import pytest
import torch
from helpers.rollout import ForceTurns, arith_problems, call_turn, final_turn, random_policy
from helpers.sandbox_fusion import FakeSandboxFusion
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.config import load_config
from agentrl.data.records import Trajectory
from agentrl.rollout import AgentLoop, SamplingParams
from agentrl.rollout.hf_engine import HFEngine
from agentrl.tools import sandbox_fusion
from agentrl.tools.code_interpreter import CodeInterpreter
from agentrl.tools.factory import make_sandbox
from agentrl.tools.health import InfraFailureBound, InfraFailureShareExceeded, ToolUse, tool_health
from agentrl.tools.sandbox import OUTCOMES, LocalSandbox

GREEDY = SamplingParams(temperature=0)
FAST = {"workers": 1, "preload_modules": ["json"], "timeout_s": 2, "cpu_time_s": 5}


def sandbox_cfg(**overrides):
    return load_config({"sandbox": {**FAST, **overrides}}).sandbox


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def policy():
    model_dir = random_policy()
    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def service():
    """A SandboxFusion service on a local sandbox; ``http_failures`` makes it refuse requests."""
    with LocalSandbox(sandbox_cfg(workers=2)) as backend:
        fake = FakeSandboxFusion(backend)
        thread = threading.Thread(target=fake.serve_forever, daemon=True)
        thread.start()
        yield fake
        fake.shutdown()
        fake.server_close()


@pytest.fixture()
def fusion(service, monkeypatch):
    monkeypatch.setattr(sandbox_fusion, "_BACKOFF_S", 0.01)
    service.http_failures.clear()
    cfg = sandbox_cfg(backend="sandbox_fusion", sandbox_fusion_url=service.url)
    with make_sandbox(cfg) as client:
        yield client


class WorkerKillingSandbox(LocalSandbox):
    """The local sandbox, whose worker is SIGKILLed from outside while it runs the calls numbered
    in ``kill_calls`` (counted from 0, in the order they reach ``run``)."""

    def __init__(self, cfg, kill_calls):
        super().__init__(cfg)
        self.kill_calls = set(kill_calls)
        self.calls = itertools.count()

    def run(self, code, stdin=None, timeout_s=None):
        if next(self.calls) in self.kill_calls:  # the worker is started (again) for this call if it is gone
            threading.Timer(0.3, self._kill_worker).start()
        return super().run(code, stdin, timeout_s)

    def _kill_worker(self):
        for pid in self.worker_pids():
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- each outcome, where it happens
def test_program_outcomes_and_latency_in_the_real_sandbox():
    with make_sandbox(sandbox_cfg(cpu_time_s=1, timeout_s=10)) as sb:
        ok = sb.run("print(1)")
        raised = sb.run("raise ValueError('bad')")
        exited = sb.run("import sys; sys.exit(3)")
        looped = sb.run("while True:\n    pass", timeout_s=0.5)
        busy = sb.run("while True:\n    pass")  # the 1 s CPU limit stops it, not the 10 s wall clock
    assert ok.outcome == "ok" and ok.duration_s > 0 and ok.queue_s >= 0
    assert raised.outcome == "program_error" and "ValueError" in raised.stderr
    assert exited.outcome == "program_error" and exited.exit_code == 3
    assert looped.outcome == "program_timeout" and looped.duration_s >= 0.5
    assert busy.outcome == "program_timeout" and busy.status == "killed", busy
    assert not any(r.infra_failure for r in (ok, raised, exited, looped, busy))


def test_a_worker_killed_while_running_is_an_infra_failure():
    with WorkerKillingSandbox(sandbox_cfg(timeout_s=10), kill_calls=[0]) as sb:
        lost = sb.run("import time\ntime.sleep(5)\nprint('done')")
        after = sb.run("print(2)")
    assert lost.outcome == "infra_failure" and lost.exit_code is None and "worker" in lost.stderr, lost
    assert after.outcome == "ok", "the worker must have been replaced"


def test_a_refusing_sandbox_fusion_service_is_an_infra_failure(fusion, service):
    service.http_failures.extend([503, 503, 503])
    refused = fusion.run("print(1)")
    assert refused.outcome == "infra_failure" and "HTTP 503" in refused.stderr
    service.http_failures.append(400)  # a request refused outright (not retried) is the sandbox's too
    assert fusion.run("print(1)").outcome == "infra_failure"
    assert fusion.run("print(1)").outcome == "ok"
    assert fusion.run("raise KeyError(1)").outcome == "program_error"
    assert fusion.run("while True:\n    pass", timeout_s=0.5).outcome == "program_timeout"


def test_a_service_that_does_not_listen_is_an_infra_failure(monkeypatch):
    monkeypatch.setattr(sandbox_fusion, "_BACKOFF_S", 0.01)
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cfg = sandbox_cfg(backend="sandbox_fusion", sandbox_fusion_url=f"http://127.0.0.1:{port}")
    with sandbox_fusion.SandboxFusionSandbox(cfg) as sb:  # gone after the stage's start probe passed
        assert sb.run("print(1)").outcome == "infra_failure"
    with pytest.raises(sandbox_fusion.SandboxFusionUnreachable, match=f"sandbox.sandbox_fusion_url.*127.0.0.1:{port}"):
        make_sandbox(cfg)  # at the start: refused, naming the key and the URL


def test_a_queue_wait_over_the_limit_is_an_infra_failure_and_waits_are_measured():
    slow = "import time\ntime.sleep(1)\nprint(1)"
    with make_sandbox(sandbox_cfg()) as sb:
        first, second = sb.run_many([(slow, None), (slow, None)])
    assert first.outcome == second.outcome == "ok"
    assert second.queue_s >= 0.9 > first.queue_s, "one worker: the second call waits for the first"
    with make_sandbox(sandbox_cfg(max_queue_wait_s=0.5)) as sb:
        first, second = [f.result() for f in [sb.submit(slow), sb.submit(slow)]]
    assert first.outcome == "ok"
    assert second.outcome == "infra_failure" and second.queue_s >= 0.5 and "max_queue_wait_s" in second.stderr


# --------------------------------------------------------------------------- in the agent loop
def _loop(policy, sandbox, scripts, bound=None, **rollout) -> AgentLoop:
    model, tokenizer = policy
    cfg = load_config({"rollout": {"max_turns": 5, "max_response_tokens": 400, **rollout}})
    engine = HFEngine(
        model, pad_token_id=tokenizer.pad_token_id, batch_size=8, logits_processor=ForceTurns(tokenizer, scripts)
    )
    return AgentLoop(engine, tokenizer, CodeInterpreter(sandbox, cfg.tool), cfg.rollout, bound)


@pytest.mark.parametrize("scheduling", ["per_trajectory", "per_turn"])
def test_the_loop_classifies_every_call(policy, scheduling):
    _, tokenizer = policy
    malformed = tokenizer.encode('<tool_call>\n{"name": "code_interpreter", "arguments": {}}\n</tool_call>')
    scripts = [
        malformed,
        call_turn(tokenizer, "1 / 0"),
        call_turn(tokenizer, "while True: pass"),
        call_turn(tokenizer, "print(6 * 7)"),
        final_turn(tokenizer, "42"),
    ]
    with make_sandbox(sandbox_cfg(timeout_s=0.5)) as sb:
        [trajectory] = _loop(policy, sb, scripts, scheduling=scheduling).run(arith_problems(1), 1, GREEDY, seed=0)
    assert trajectory.tool_outcomes == ["parse_failure", "program_error", "program_timeout", "ok"]
    assert trajectory.tool_errors == [True, True, True, False]
    assert trajectory.tool_queue_s[0] == trajectory.tool_run_s[0] == 0.0, "a malformed call never ran"
    assert trajectory.tool_run_s[2] >= 0.5 and all(s > 0 for s in trajectory.tool_run_s[1:])
    assert (trajectory.attempts, trajectory.infra_failed, trajectory.finish_reason) == (1, False, "stop")
    health = tool_health([ToolUse.of(trajectory)])
    assert health["calls"] == 4 and health["calls_per_trajectory"] == 4
    assert {o: health[f"share/{o}"] for o in OUTCOMES} == {
        "ok": 0.25,
        "parse_failure": 0.25,
        "program_error": 0.25,
        "program_timeout": 0.25,
        "infra_failure": 0.0,
    }
    assert health["run_s_p95"] > 0.4 > health["run_s_p50"] and health["infra_excluded"] == 0


@pytest.mark.parametrize("scheduling", ["per_trajectory", "per_turn"])
def test_a_lost_call_is_retried_with_the_same_seeds(policy, fusion, service, scheduling):
    _, tokenizer = policy
    scripts = [call_turn(tokenizer, "print(6 * 7)"), final_turn(tokenizer, "42")]
    params = SamplingParams(temperature=1.0)  # free sampling past the scripts: the seeds matter
    problems = arith_problems(1)
    healthy = _loop(policy, fusion, scripts, scheduling=scheduling, max_response_tokens=120).run(
        problems, 2, params, seed=3
    )
    service.http_failures.extend([503] * 3)  # the first call's three attempts
    loop = _loop(policy, fusion, scripts, scheduling=scheduling, max_response_tokens=120)
    retried = loop.run(problems, 2, params, seed=3)
    lost = [t for t in retried if t.attempts == 2]
    assert len(lost) == 1 and not lost[0].infra_failed, [t.attempts for t in retried]
    assert loop.stats.retries == loop.stats.infra_failures == 1
    for before, after in zip(healthy, retried):
        assert after.response_ids == before.response_ids, "the retry samples what the healthy run sampled"
        assert after.tool_outcomes == before.tool_outcomes == ["ok"]


@pytest.mark.parametrize("scheduling", ["per_trajectory", "per_turn"])
def test_a_sandbox_that_loses_every_call_stops_the_call_naming_the_key(policy, fusion, service, scheduling):
    _, tokenizer = policy
    scripts = [call_turn(tokenizer, "print(6 * 7)"), final_turn(tokenizer, "42")]
    service.http_failures.extend([503] * 100)
    handed: list[list[Trajectory]] = []
    loop = _loop(policy, fusion, scripts, InfraFailureBound(0.05, 256), scheduling=scheduling)
    with pytest.raises(InfraFailureShareExceeded, match=r"sandbox\.max_infra_failure_share=0\.05"):
        loop.run(arith_problems(2), 2, GREEDY, seed=0, on_problem_done=handed.append)
    assert len(handed) == 2, "under a full window the share is judged at the end of the call"
    assert all(t.infra_failed and t.attempts == 2 and t.finish_reason == "infra_failure" for g in handed for t in g)
    assert all(t.tool_outcomes == ["infra_failure"] for g in handed for t in g)
    # With a window it is judged as soon as the window is full, before the group is handed over.
    service.http_failures[:] = [503] * 100
    handed.clear()
    loop = _loop(policy, fusion, scripts, InfraFailureBound(0.05, 2), scheduling=scheduling)
    with pytest.raises(InfraFailureShareExceeded, match="max_infra_failure_share"):
        loop.run(arith_problems(2), 2, GREEDY, seed=0, on_problem_done=handed.append)
    assert handed == []
    service.http_failures.clear()


def test_the_bound_judges_the_last_window():
    bound = InfraFailureBound(0.25, window=4)
    bound.observe([True, False, False, False])  # 1 of 4: at the bound, not over it
    bound.observe([False])  # the failure left the window
    bound.observe([True])  # 1 of the last 4 again
    bound.check()
    with pytest.raises(InfraFailureShareExceeded, match="2 of the last 4"):
        bound.observe([True])
    short = InfraFailureBound(0.25, window=100)
    short.observe([True, False, False])  # under the window: judged only by check
    with pytest.raises(InfraFailureShareExceeded, match="1 of the last 3"):
        short.check()
    assert load_config({}).sandbox.max_infra_failure_share == 0.05


# --------------------------------------------------------------------------- in a GRPO step
def _grpo_step(sandbox, scripts, n: int, **grpo):
    """A real GRPO step's parts on DeepSpeed: the tiny random policy, its hf engine sharing the
    actor's module (scripted by ForceTurns), the agent loop over ``sandbox``, the reward registry."""
    from pathlib import Path

    from agentrl.grpo.policy import ResponseLogProbs
    from agentrl.grpo.step import Components, GrpoStep
    from agentrl.grpo.trainer import GrpoPaths, build_engine, reward_config
    from agentrl.grpo.variants import resolve_algorithm
    from agentrl.rewards import RewardFunction
    from agentrl.training import deepspeed_engine as dse
    from agentrl.training.model import load_causal_lm

    model_dir = random_policy()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    cfg = load_config(
        {
            "rollout": {"scheduling": "per_turn", "max_turns": 3, "max_response_tokens": 96},
            "reward": {"overlong": {"enable": False}},  # a 96-token budget holds no 128-token buffer
            "grpo": {"n": n, "batch_prompts": 2, "mini_batch_prompts": 2, "lr": 1e-3, **grpo},
        }
    )
    ctx = dse.init_distributed()
    paths = GrpoPaths(Path(model_dir), *(Path("-"),) * 5, dse.find_deepspeed_config(0))
    actor = ResponseLogProbs(load_causal_lm(model_dir, device=ctx.device), logit_chunk_tokens=64, temperature=1.0)
    engine = build_engine(actor, cfg, paths, ctx, torch.float32, steps=1)
    rollout_engine = HFEngine(
        engine.module.model, pad_token_id=0, batch_size=8, logits_processor=ForceTurns(tokenizer, scripts)
    )
    settings = resolve_algorithm(cfg.grpo)
    loop = AgentLoop(
        rollout_engine,
        tokenizer,
        CodeInterpreter(sandbox, cfg.tool),
        cfg.rollout,
        InfraFailureBound.from_config(sandbox.config),
    )
    reward_fn = RewardFunction(reward_config(cfg, settings), sandbox)
    parts = Components(cfg, settings, ctx, engine, None, rollout_engine, loop, reward_fn, tokenizer.pad_token_id)
    return GrpoStep(parts), cfg


def test_a_grpo_step_leaves_an_infra_failed_trajectory_out_of_its_group(policy):
    from agentrl.grpo import algorithm as alg
    from agentrl.grpo.prompts import PromptSampler
    from agentrl.grpo.step import Group

    _, tokenizer = policy
    scripts = [call_turn(tokenizer, "import time; time.sleep(1); print(6 * 7)"), final_turn(tokenizer, "42")]
    # One worker, calls in order (per_turn): turn 0 runs the 6 rollouts' calls 0-5; the first
    # rollout's is lost, so it starts again and its retry's call is number 6 of turn 1: lost too.
    sandbox = WorkerKillingSandbox(sandbox_cfg(max_infra_failure_share=0.5), kill_calls=[0, 6])
    with sandbox:
        step, cfg = _grpo_step(sandbox, scripts, n=3)
        seen = []
        real_advantages = step.advantages
        step.advantages = lambda groups: seen.append((groups, real_advantages(groups))) or seen[-1][1]
        record = step.run(1, PromptSampler(arith_problems(2), seed=0))
    [(groups, advantages)] = seen
    trajectories = [t for g in groups for t in g.trajectories]
    assert [(t.attempts, t.infra_failed) for t in trajectories] == [(2, True)] + [(1, False)] * 5
    assert trajectories[0].tool_outcomes == ["infra_failure"]
    assert advantages[0][0] == 0.0
    kept = torch.tensor(groups[0].scores[1:], dtype=torch.float64)
    assert advantages[0][1:] == alg.group_advantages(kept, 2, norm_by_std=True).tolist()
    # No loss token of it reaches the update, and the rollout metrics count the others only.
    assert record["actor/loss_tokens"] == sum(sum(t.loss_mask) for t in trajectories[1:])
    assert record["rollout/trajectories"] == 5.0
    assert record["tool_health/infra_excluded"] == 1.0 and record["tool_health/retried"] == 1.0
    assert record["tool_health/share/infra_failure"] == pytest.approx(1 / 6)
    assert record["tool_health/share/ok"] == pytest.approx(5 / 6)
    assert record["tool_health/run_s_p50"] >= 1.0
    # The trainer's own advantages on these trajectories with rewards that differ: the same as
    # the group's advantages computed without the excluded trajectory.
    scored = [
        Group(g.problem, g.trajectories, s, [False] * 3, [0.0] * 3)
        for g, s in zip(groups, ([9.0, 1.0, -1.0], [2.0, 0.0, 1.0]))
    ]
    first, second = step.advantages(scored)
    assert first == [
        0.0,
        *alg.group_advantages(torch.tensor([1.0, -1.0], dtype=torch.float64), 2, norm_by_std=True).tolist(),
    ]
    assert (
        second == alg.group_advantages(torch.tensor([2.0, 0.0, 1.0], dtype=torch.float64), 3, norm_by_std=True).tolist()
    )
    assert not scored[0].uniform and Group(groups[0].problem, groups[0].trajectories, [9.0, 1.0, 1.0], [], []).uniform


def test_a_grpo_step_whose_sandbox_loses_every_call_stops_naming_the_key(policy):
    from agentrl.grpo.prompts import PromptSampler

    _, tokenizer = policy
    scripts = [call_turn(tokenizer, "import time; time.sleep(1); print(6 * 7)"), final_turn(tokenizer, "42")]
    with WorkerKillingSandbox(sandbox_cfg(), kill_calls=range(100)) as sandbox:
        step, _ = _grpo_step(sandbox, scripts, n=2)
        updates = []
        step.update = lambda *args: updates.append(args)
        with pytest.raises(InfraFailureShareExceeded, match=r"sandbox\.max_infra_failure_share"):
            step.run(1, PromptSampler(arith_problems(2), seed=0))
    assert updates == [], "the step stops before any update"


def test_grpo_validation_leaves_out_a_problem_with_a_lost_trajectory(policy):
    from agentrl.grpo.validation import EvalSet, validate

    _, tokenizer = policy
    scripts = [call_turn(tokenizer, "import time; time.sleep(1); print(6 * 7)"), final_turn(tokenizer, "42")]
    problems = tuple(arith_problems(2))
    # 2 problems x validation n 2 = 4 rollouts: the first one's call and its retry's (number 4) lost.
    with WorkerKillingSandbox(sandbox_cfg(max_infra_failure_share=0.5), kill_calls=[0, 4]) as sandbox:
        step, cfg = _grpo_step(sandbox, scripts, n=2, validation={"n": 2})
        metrics = validate(cfg, step.parts.loop, step.parts.reward_fn, [EvalSet("arith", problems)], step.ctx)
        whole = validate(cfg, step.parts.loop, step.parts.reward_fn, [EvalSet("arith", problems[1:])], step.ctx)
    assert metrics["val/arith/problems_left_out"] == 1.0
    assert metrics["val/arith/avg@2"] == whole["val/arith/avg@2"], "the average is the other problem's alone"
    assert "val/arith/problems_left_out" not in whole


# --------------------------------------------------------------------------- the reward's own code tests
ADD_TESTS = {"inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]}
ADD_RESPONSE = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


def test_a_code_test_case_the_sandbox_loses_is_run_again_and_a_reward_lost_twice_leaves_its_trajectory_out(
    fusion, service
):
    from agentrl.data.records import Problem
    from agentrl.rewards import RewardFunction, leave_out_lost_rewards

    reward_fn = RewardFunction(load_config({}).reward, fusion)
    problem = Problem("add", "embedded-code", [], "code", ADD_TESTS)
    item = (problem, ADD_RESPONSE, 10, 0)
    clean = reward_fn.score_many([item])[0]
    assert clean.details["cases_passed"] == 2 and not clean.infra_failure

    service.http_failures.append(400)  # one case refused outright: its rerun passes, the score is the response's
    retried = reward_fn.score_many([item])[0]
    assert (retried.score, retried.details["cases_passed"], retried.infra_failure) == (clean.score, 2, False)

    service.sandbox_error = True  # every case lost, on the rerun too
    try:
        lost, other = reward_fn.score_many([item, (problem, "no code here", 3, 0)])
    finally:
        service.sandbox_error = False
    assert lost.infra_failure and not other.infra_failure, "a response without code runs nothing to lose"
    trajectories = [Trajectory("add", i, [], [], [], [], "", 1, [], [], "stop") for i in range(2)]
    leave_out_lost_rewards(trajectories, [lost, other])
    assert [t.infra_failed for t in trajectories] == [True, False]
