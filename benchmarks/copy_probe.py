"""How well a model copies each held-out problem's numbers into its code and its answer (teacher forced).

The embedded families fail first at copying: the agent must write the problem's numbers into the
code it sends to the tool, and the tool's output into its answer. This renders, for each problem
of an arith or choice eval set, the conversation the SFT data teaches (the prompt; the tool
call's code: ``print(<expression>)`` for arith, ``options = dict(<options>)`` and the letters
matching ``<expression>`` for choice; the tool's true output; the final turn ``The result is
<value>.\n\\boxed{<value>}`` or ``Option <letter> matches.\n\\boxed{<letter>}``) with the
model's own chat template, and reads the model's probabilities for each copied span's tokens
(``expression``, ``options``; ``stated``: the value or letter in the final sentence; ``boxed``:
the one in the box):

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

from agentrl.data.embedded import choice_code, choice_conclusion
from agentrl.data.prompts import CODE_INTERPRETER_TOOL
from agentrl.data.records import read_problems

EXPRESSION = re.compile(r"(?:Compute|Which option equals) (.+?)[.?](?:\n| Use)")
OPTIONS = re.compile(r"\?\n(A=.+)\n")
LEAD_IN = "Let me compute it with the tool."
# Stand-ins for the copied spans, so their token spans can be found after rendering.
MARKERS = {"options": "\u2603", "expression": "\u2604", "stated": "\u2605", "boxed": "\u2606"}


def _spans(prompt: str) -> tuple[str, str, str, dict[str, str]]:
    """The code and the final turn with markers in place of the copied spans, the tool's output,
    and each span's true text."""
    expression = EXPRESSION.search(prompt)
    if expression is None:
        raise ValueError("no 'Compute ...' or 'Which option equals ...?'")
    value = eval(expression.group(1))  # the embedded expressions are integer arithmetic
    options = OPTIONS.search(prompt) if prompt.startswith("Which option") else None
    if options is None:
        final = f"The result is {MARKERS['stated']}.\n\\boxed{{{MARKERS['boxed']}}}"
        return (
            f"print({MARKERS['expression']})",
            f"{value}\n",
            final,
            {"expression": expression.group(1), "stated": str(value), "boxed": str(value)},
        )
    letter = next(k for k, v in eval(f"dict({options.group(1)})").items() if v == value)
    setup, matches = choice_code(MARKERS["options"], MARKERS["expression"])
    final = choice_conclusion(MARKERS["stated"]).replace(f"{{{MARKERS['stated']}}}", f"{{{MARKERS['boxed']}}}")
    return (
        f"{setup}\nprint({matches})",
        f"{[letter]}\n",
        final,
        {"options": options.group(1), "expression": expression.group(1), "stated": letter, "boxed": letter},
    )


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
            code, tool_output, final, spans = _spans(prompt)
        except ValueError as error:
            raise SystemExit(f"{problems_path}: problem {problem.id}: {error}") from None
        messages = [
            {"role": "user", "content": prompt},
            {
                "role": "assistant",
                "content": LEAD_IN,
                "tool_calls": [
                    {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}
                ],
            },
            {"role": "tool", "content": tool_output},
            {"role": "assistant", "content": final},
        ]
        text = tokenizer.apply_chat_template(messages, tools=[CODE_INTERPRETER_TOOL], tokenize=False)
        # Put each span's true text in place of its marker, then tokenize the whole text as SFT
        # does: a span's tokens are those whose characters overlap it (a letter after a space
        # is one token with the space, " D", so spans cannot be tokenized on their own).
        chars: dict[str, tuple[int, int]] = {}
        for name in sorted(spans, key=lambda n: text.index(MARKERS[n])):
            start = text.index(MARKERS[name])
            text = text[:start] + spans[name] + text[start + 1 :]
            chars[name] = (start, start + len(spans[name]))
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = encoding.input_ids
        ranges: dict[str, tuple[int, int]] = {}
        for name, (first, last) in chars.items():
            inside = [i for i, (a, b) in enumerate(encoding.offset_mapping) if a < last and b > first]
            ranges[name] = (inside[0], inside[-1] + 1)
        end = max(stop for _, stop in ranges.values())
        with torch.no_grad():
            logprobs = model(torch.tensor([ids[:end]])).logits[0].float().log_softmax(-1)
        for name, (start, stop) in ranges.items():
            rows = logprobs[start - 1 : stop - 1]
            target = torch.tensor(ids[start:stop])
            chosen = rows.gather(1, target[:, None])[:, 0]
            token_probs.setdefault(name, []).extend(chosen.exp().tolist())
            hits.setdefault(name, []).extend((rows.argmax(-1) == target).tolist())
            whole.setdefault(name, []).append(math.exp(chosen.sum().item()))
    out: dict = {"model": str(model_dir), "problems": str(problems_path), "n_problems": len(problems)}
    for name in token_probs:
        out[name] = {
            "token_argmax_accuracy": sum(hits[name]) / len(hits[name]),
            "token_probability_mean": sum(token_probs[name]) / len(token_probs[name]),
            "whole_span_probability_mean": sum(whole[name]) / len(whole[name]),
        }
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
