"""How well a model copies each held-out problem's numbers into its code (teacher forced).

The embedded families fail first at copying: the agent must write the problem's numbers into the
code it sends to the tool. This renders, for each problem of an arith or choice eval set, the
conversation the SFT data teaches (the prompt, then the tool call's code: ``print(<expression>)``
for arith; ``options = dict(<options>)`` and the letters matching ``<expression>`` for choice)
with the model's own chat template, and reads the model's probabilities for each copied span's
tokens:

- per-token argmax accuracy and mean probability over the span's tokens;
- P(whole span): the product over one span, averaged over problems - the chance that a sample at
  temperature 1 copies it exactly.

    python benchmarks/copy_probe.py --model results/models/sft --problems results/data/eval/arith.parquet

Not a test: a diagnostic whose figures the README quotes.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.data.embedded import choice_code
from agentrl.data.prompts import CODE_INTERPRETER_TOOL
from agentrl.data.records import read_problems

EXPRESSION = re.compile(r"(?:Compute|Which option equals) (.+?)[.?](?:\n| Use)")
OPTIONS = re.compile(r"\?\n(A=.+)\n")
LEAD_IN = "Let me compute it with the tool."
# Stand-ins for the copied spans, so their token spans can be found after rendering.
MARKERS = {"options": "\u2603", "expression": "\u2604"}


def _spans(prompt: str) -> tuple[str, dict[str, str]]:
    """The code with markers in place of the copied spans, and each span's true text."""
    expression = EXPRESSION.search(prompt)
    if expression is None:
        raise ValueError("no 'Compute ...' or 'Which option equals ...?'")
    options = OPTIONS.search(prompt) if prompt.startswith("Which option") else None
    if options is None:
        return f"print({MARKERS['expression']})", {"expression": expression.group(1)}
    setup, matches = choice_code(MARKERS["options"], MARKERS["expression"])
    return f"{setup}\nprint({matches})", {"options": options.group(1), "expression": expression.group(1)}


def probe(model_dir: Path, problems_path: Path, limit: int | None) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    problems = read_problems(problems_path)[:limit]
    token_probs: dict[str, list[float]] = {}
    hits: dict[str, list[bool]] = {}
    whole: dict[str, list[float]] = {}
    for problem in problems:
        prompt = problem.prompt[0]["content"]
        try:
            code, spans = _spans(prompt)
        except ValueError as error:
            raise SystemExit(f"{problems_path}: problem {problem.id}: {error}") from None
        messages = [{"role": "user", "content": prompt},
                    {"role": "assistant", "content": LEAD_IN, "tool_calls": [
                        {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}]}]
        text = tokenizer.apply_chat_template(messages, tools=[CODE_INTERPRETER_TOOL], tokenize=False)
        # Tokenize piece by piece in text order: the text between spans, then each span.
        ids: list[int] = []
        ranges: dict[str, tuple[int, int]] = {}
        rest = text
        for name in sorted(spans, key=lambda n: text.index(MARKERS[n])):
            before, rest = rest.split(MARKERS[name], 1)
            ids += tokenizer(before, add_special_tokens=False).input_ids
            span_ids = tokenizer(spans[name], add_special_tokens=False).input_ids
            ranges[name] = (len(ids), len(ids) + len(span_ids))
            ids += span_ids
        end = max(stop for _, stop in ranges.values())
        with torch.no_grad():
            logprobs = model(torch.tensor([ids[:end]])).logits[0].float().log_softmax(-1)
        for name, (start, stop) in ranges.items():
            rows = logprobs[start - 1:stop - 1]
            target = torch.tensor(ids[start:stop])
            chosen = rows.gather(1, target[:, None])[:, 0]
            token_probs.setdefault(name, []).extend(chosen.exp().tolist())
            hits.setdefault(name, []).extend((rows.argmax(-1) == target).tolist())
            whole.setdefault(name, []).append(math.exp(chosen.sum().item()))
    out: dict = {"model": str(model_dir), "problems": str(problems_path), "n_problems": len(problems)}
    for name in token_probs:
        out[name] = {"token_argmax_accuracy": sum(hits[name]) / len(hits[name]),
                     "token_probability_mean": sum(token_probs[name]) / len(token_probs[name]),
                     "whole_span_probability_mean": sum(whole[name]) / len(whole[name])}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True, action="append", help="model folder (repeatable)")
    parser.add_argument("--problems", type=Path, required=True, help="an arith or choice eval parquet")
    parser.add_argument("--limit", type=int, default=None, help="first N problems only")
    args = parser.parse_args()
    for model_dir in args.model:
        print(json.dumps(probe(model_dir, args.problems, args.limit)))


if __name__ == "__main__":
    main()
