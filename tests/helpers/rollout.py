"""Real small models for the rollout tests (imported through ``helpers.rollout``).

- :func:`random_policy`: a tokenizer trained on a few rendered tool-use conversations and a
  randomly initialised tiny Qwen3 (built in about a second). It never emits a tool call by
  itself, so loop-mechanics tests drive it with :class:`ForceTurns`, a logits processor that
  makes the real engine emit scripted turns (the model still runs every forward pass).
- :func:`trained_policy`: that model after a plain AdamW loop on the assistant tokens of
  solved arithmetic problems in the embedded task's format (a call that prints the value, the
  tool output, a boxed answer), until it writes hermes tool calls by itself (about half a minute
  on a CPU). Both are built once per test session (``functools.cache``) in a temporary folder.
"""

from __future__ import annotations

import atexit
import functools
import random
import re
import shutil
import tempfile
import time
from pathlib import Path

import torch

from agentrl.data.prompts import CODE_INTERPRETER_TOOL, COMPACT_MATH
from agentrl.data.records import Problem
from agentrl.rollout import AgentLoop, SamplingParams
from helpers.tiny_models import ROLLOUT_POLICY


def _call(code: str) -> dict:
    return {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}


def arith_problems(count: int, seed: int = 0) -> list[Problem]:
    """Problems in the embedded arithmetic task's format (compact prompt, integer ground truth)."""
    rng = random.Random(seed)
    problems = []
    for index in range(count):
        expression = f"{rng.randint(10, 99)} {rng.choice('+-*')} {rng.randint(10, 99)}"
        problems.append(
            Problem(
                id=f"arith-test-{index:03d}",
                data_source="embedded-arith",
                ability="math",
                prompt=[{"role": "user", "content": COMPACT_MATH.format(expression=expression)}],
                ground_truth=str(eval(expression)),
                extra={"expression": expression},
            )
        )
    return problems


def sft_conversations(count: int, seed: int = 1) -> list[list[dict]]:
    """Solved problems: one tool call that prints the value, the tool's output, a boxed answer."""
    conversations = []
    for problem in arith_problems(count, seed):
        expression, value = problem.extra["expression"], problem.ground_truth
        conversations.append(
            problem.prompt
            + [
                {
                    "role": "assistant",
                    "content": "Let me compute it with the tool.",
                    "tool_calls": [_call(f"print({expression})")],
                },
                {"role": "tool", "content": f"{value}\n"},
                {"role": "assistant", "content": f"The result is {value}.\n\\boxed{{{value}}}"},
            ]
        )
    return conversations


def _corpus() -> list[str]:
    from agentrl.model.build import train_tokenizer

    renderer = train_tokenizer(["0123456789"], 300, "qwen3")
    return [
        renderer.apply_chat_template(m, tools=[CODE_INTERPRETER_TOOL], tokenize=False) for m in sft_conversations(64)
    ]


@functools.cache
def random_policy(seed: int = 0) -> Path:
    """A folder with a random tiny Qwen3 and its tokenizer (chat template included)."""
    from agentrl.model.build import save_embedded_model

    root = tempfile.mkdtemp(prefix="agentrl-random-policy-")
    atexit.register(shutil.rmtree, root, True)  # cached for the session, removed when it ends
    out = Path(root) / "model"
    return save_embedded_model(_corpus(), ROLLOUT_POLICY, seed, out)


class ForceTurns:
    """Logits processor: turn ``k`` of every trajectory is ``scripts[k]`` (token ids), forced.

    The turn is the number of ``<tool_response>`` tokens already in the context; the position in
    the script is the number of tokens after the last assistant header. Past the end of a script
    (or of the list) the model samples freely.
    """

    def __init__(self, tokenizer, scripts: list[list[int]]):
        self.scripts = scripts
        self.response_open = tokenizer.convert_tokens_to_ids("<tool_response>")
        self.header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)

    def _position(self, row: list[int]) -> int:
        width = len(self.header)
        for start in range(len(row) - width, -1, -1):
            if row[start : start + width] == self.header:
                return len(row) - start - width
        raise AssertionError("no assistant header in the context")

    def __call__(self, sequences: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        for b, row in enumerate(sequences.tolist()):
            turn = row.count(self.response_open)
            position = self._position(row)
            if turn < len(self.scripts) and position < len(self.scripts[turn]):
                forced = self.scripts[turn][position]
                logits[b] = float("-inf")
                logits[b, forced] = 0.0
        return logits


def call_turn(tokenizer, code: str, thought: str = "Let me run it.") -> list[int]:
    """The ids of an assistant turn that makes one well-formed call (canonical tokenization)."""
    text = f'{thought}\n<tool_call>\n{{"name": "code_interpreter", "arguments": {{"code": "{code}"}}}}\n</tool_call>'
    return tokenizer.encode(text, add_special_tokens=False)


def final_turn(tokenizer, answer: str) -> list[int]:
    return tokenizer.encode(f"The answer is \\boxed{{{answer}}}.<|im_end|>", add_special_tokens=False)


# --------------------------------------------------------------------------- trained model
def assistant_token_mask(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """Token ids of a rendered conversation and the SFT loss mask (assistant content + <|im_end|>)."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = [m.span(1) for m in re.finditer(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", text, re.DOTALL)]
    mask = [int(any(lo <= start < hi for lo, hi in spans)) for start, _ in encoded["offset_mapping"]]
    return encoded["input_ids"], mask


def sft_train(
    model, tokenizer, conversations: list[str], steps: int, lr: float, batch_size: int, seed: int
) -> list[float]:
    """Plain AdamW on the assistant tokens of the rendered conversations; returns the losses."""
    rows = [assistant_token_mask(tokenizer, text) for text in conversations]
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        picked = torch.randperm(len(rows), generator=generator)[:batch_size].tolist()
        width = max(len(rows[i][0]) for i in picked)
        ids = torch.full((len(picked), width), tokenizer.pad_token_id)
        labels = torch.full((len(picked), width), -100)
        for b, i in enumerate(picked):
            tokens, mask = rows[i]
            ids[b, : len(tokens)] = torch.tensor(tokens)
            labels[b, : len(tokens)] = torch.where(torch.tensor(mask) == 1, torch.tensor(tokens), -100)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model.eval()
    return losses


@functools.cache
def trained_policy(steps: int = 100) -> Path:
    """A copy of :func:`random_policy` trained on :func:`sft_conversations` until it calls the tool itself."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tempfile.mkdtemp(prefix="agentrl-trained-policy-")
    atexit.register(shutil.rmtree, root, True)
    model_dir = Path(root) / "model"
    shutil.copytree(random_policy(), model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    texts = [
        tokenizer.apply_chat_template(m, tools=[CODE_INTERPRETER_TOOL], tokenize=False) for m in sft_conversations(64)
    ]
    started = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls on a shared CPU: extra intra-op threads make it ~10x slower
    try:
        losses = sft_train(model, tokenizer, texts, steps=steps, lr=3e-3, batch_size=8, seed=0)
    finally:
        torch.set_num_threads(threads)
    print(
        f"trained_policy: {steps} steps in {time.perf_counter() - started:.1f} s, "
        f"loss {losses[0]:.2f} -> {sum(losses[-10:]) / 10:.3f}"
    )
    assert sum(losses[-10:]) / 10 < 0.5 * losses[0], (
        f"the tiny model did not learn: {losses[0]:.2f} -> {losses[-1]:.2f}"
    )
    model.save_pretrained(model_dir)
    return model_dir


GREEDY = SamplingParams(temperature=0)


def scripted_loop(policy, interpreter, scripts, **rollout) -> AgentLoop:
    """An agent loop on the ``hf`` engine whose turns follow ``scripts`` (:class:`ForceTurns`)."""
    from agentrl.config import load_config
    from agentrl.rollout.hf_engine import HFEngine

    model, tokenizer = policy
    cfg = load_config({"rollout": {"max_turns": 4, "max_response_tokens": 400, **rollout}}).rollout
    engine = HFEngine(
        model, pad_token_id=tokenizer.pad_token_id, batch_size=8, logits_processor=ForceTurns(tokenizer, scripts)
    )
    return AgentLoop(engine, tokenizer, interpreter, cfg)
