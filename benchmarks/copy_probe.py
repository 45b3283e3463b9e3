"""How well a model copies each held-out expression from the problem into its code (teacher forced).

The embedded families fail first at copying: the agent must write the problem's numbers into the
code it sends to the tool. This renders, for each problem of an arith or choice eval set, the
conversation the SFT data teaches (the prompt, then ``print(<expression>)`` in a tool call) with
the model's own chat template, and reads the model's probabilities for the expression's tokens:

- per-token argmax accuracy and mean probability over the expression tokens;
- P(whole expression): the product over one expression, averaged over problems - the chance that
  a sample at temperature 1 copies it exactly.

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

from agentrl.data.prompts import CODE_INTERPRETER_TOOL
from agentrl.data.records import read_problems

EXPRESSION = re.compile(r"(?:Compute|Which option equals) (.+?)[.?](?:\n| Use)")
LEAD_IN = "Let me compute it with the tool."


def probe(model_dir: Path, problems_path: Path, limit: int | None) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    problems = read_problems(problems_path)[:limit]
    token_probs: list[float] = []
    hits: list[bool] = []
    whole: list[float] = []
    for problem in problems:
        prompt = problem.prompt[0]["content"]
        match = EXPRESSION.search(prompt)
        if match is None:
            raise SystemExit(f"{problems_path}: problem {problem.id} has no 'Compute ...' or 'Which option equals ...?'")
        expression = match.group(1)
        marker = "\u2603"  # stands in for the expression, so its token span can be found after rendering
        messages = [{"role": "user", "content": prompt},
                    {"role": "assistant", "content": LEAD_IN, "tool_calls": [
                        {"type": "function", "function": {"name": "code_interpreter",
                                                          "arguments": {"code": f"print({marker})"}}}]}]
        text = tokenizer.apply_chat_template(messages, tools=[CODE_INTERPRETER_TOOL], tokenize=False)
        before, after = text.rsplit(marker, 1)
        prefix_ids = tokenizer(before, add_special_tokens=False).input_ids
        span_ids = tokenizer(expression, add_special_tokens=False).input_ids
        ids = torch.tensor([prefix_ids + span_ids])
        with torch.no_grad():
            logprobs = model(ids).logits[0].float().log_softmax(-1)
        start = len(prefix_ids)
        rows = logprobs[start - 1:start - 1 + len(span_ids)]
        target = torch.tensor(span_ids)
        chosen = rows.gather(1, target[:, None])[:, 0]
        token_probs += chosen.exp().tolist()
        hits += (rows.argmax(-1) == target).tolist()
        whole.append(math.exp(chosen.sum().item()))
    return {
        "model": str(model_dir), "problems": str(problems_path), "n_problems": len(problems),
        "token_argmax_accuracy": sum(hits) / len(hits),
        "token_probability_mean": sum(token_probs) / len(token_probs),
        "whole_expression_probability_mean": sum(whole) / len(whole),
    }


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
