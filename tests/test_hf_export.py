"""The trainers' Hugging Face export (agentrl.training.hf_export) writes what ``save_pretrained``
writes, without cloning a ZeRO-2 model's flat buffer.

Under ZeRO-2 every parameter is a view of one flat buffer; ``save_pretrained`` clones each
tensor that shares storage, the whole model at once. The streamed writer writes each tensor
from where it is. Peak memory is read as the process's resident set, sampled every millisecond
while one export runs, in a subprocess that holds a real one-process DeepSpeed ZeRO-2 engine on
CPU (the clone happens in host memory there as it does in GPU memory on a GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers.sft_runs import sft_workspace
from helpers.tiny_models import SFT_PACKING
from safetensors.torch import load_file

from agentrl.training.hf_export import distinct_tensors, save_hf_folder


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return sft_workspace(tmp_path_factory.mktemp("export"), shape=SFT_PACKING) / "base"


def test_the_folder_equals_save_pretrained_s_and_loads_with_its_tied_embedding(tiny_folder, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_folder)
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder)
    assert model.config.tie_word_embeddings, "the case of interest: an aliased output embedding"
    with torch.no_grad():  # trained weights differ from the folder's: the export writes the module's
        model.model.layers[0].mlp.up_proj.weight.add_(0.5)
    model.save_pretrained(tmp_path / "reference")
    save_hf_folder(model, tokenizer, tmp_path / "streamed")

    reference, streamed = (
        load_file(tmp_path / "reference" / "model.safetensors"),
        load_file(tmp_path / "streamed" / "model.safetensors"),
    )
    assert streamed.keys() == reference.keys() and "lm_head.weight" not in streamed
    for name in reference:
        assert torch.equal(streamed[name], reference[name]), name
    for name in ("generation_config.json",):
        assert (tmp_path / "streamed" / name).read_text() == (tmp_path / "reference" / name).read_text()
    config = json.loads((tmp_path / "streamed" / "config.json").read_text())
    expected = json.loads((tmp_path / "reference" / "config.json").read_text())
    # the digest names the weights: the loaded folder's (the reference) or the written one's
    assert config.pop("agentrl_model_sha256") != expected.pop("agentrl_model_sha256")
    assert config == expected

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "streamed")
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[1, 5, 9, 2]])
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_aliases_are_named_once_and_distinct_views_of_one_buffer_are_all_kept():
    flat = torch.arange(12.0)
    module = torch.nn.Module()
    module.a = torch.nn.Parameter(flat[:6].view(2, 3))
    module.b = torch.nn.Parameter(flat[6:].view(2, 3))
    module.c = module.a  # a tie
    assert list(distinct_tensors(module)) == ["a", "b"]


EXPORT_PEAK = """
import json, sys, threading, time
import psutil, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
from agentrl.training import deepspeed_engine as dse
from agentrl.training.hf_export import save_hf_folder

folder, out = sys.argv[1], sys.argv[2]
dse.init_distributed(1.0)
torch.manual_seed(0)
config = Qwen3Config(vocab_size=8192, hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                     num_attention_heads=8, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True)
model = Qwen3ForCausalLM(config)
tokenizer = AutoTokenizer.from_pretrained(folder)
ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 1,
      "zero_optimization": {"stage": 2}, "steps_per_print": 10**9}
optim = dse.OptimizerSettings(lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, schedule="constant",
                              warmup_steps=0, total_steps=1)
engine = dse.build_engine(model, ds, optim)
storages = {p.untyped_storage().data_ptr() for p in engine.module.parameters()}
process = psutil.Process()

def peak_extra(export):
    base, peak, running = process.memory_info().rss, [0], [True]
    def sample():
        while running[0]:
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.001)
    watcher = threading.Thread(target=sample)
    watcher.start()
    export()
    running[0] = False
    watcher.join()
    return max(peak[0], process.memory_info().rss) - base

streamed = peak_extra(lambda: save_hf_folder(engine.module, tokenizer, out + "/streamed"))
cloned = peak_extra(lambda: engine.module.save_pretrained(out + "/cloned"))
largest = max(p.numel() * p.element_size() for p in engine.module.parameters())
total = sum(p.numel() * p.element_size() for p in engine.module.parameters())
print(json.dumps({"storages": len(storages), "streamed": streamed, "cloned": cloned, "largest": largest, "total": total}))
"""


@pytest.mark.slow
def test_a_zero2_model_exports_with_at_most_a_tensor_of_extra_memory(tiny_folder, tmp_path):
    script = tmp_path / "export_peak.py"
    script.write_text(EXPORT_PEAK)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_folder), str(tmp_path)],
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    assert peaks["storages"] == 1, f"ZeRO-2 flattens the parameters into one buffer: {peaks}"
    assert peaks["cloned"] > 0.5 * peaks["total"], f"save_pretrained clones the flat buffer's views: {peaks}"
    # the streamed export holds one tensor at most, and the digest its 16 MiB read buffer
    assert peaks["streamed"] < 2 * peaks["largest"], f"the streamed export holds at most a tensor: {peaks}"
    streamed = load_file(tmp_path / "streamed" / "model.safetensors")
    cloned = load_file(tmp_path / "cloned" / "model.safetensors")
    assert streamed.keys() == cloned.keys()
    assert all(torch.equal(streamed[k], cloned[k]) for k in cloned)
