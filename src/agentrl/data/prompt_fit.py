"""Prompts over the token limit are dropped before any rollout, and counted per data source.

Upstream (verl's ``RLHFDataset`` with ``data.filter_overlong_prompts=True``) drops every row
whose prompt is longer than ``data.max_prompt_length`` when the dataset is built: 2560 tokens
for the RL set (and the validation sets of the training script), 4096 in the eval scripts. The
limits here are ``rollout.max_prompt_tokens`` (RL pool, GRPO validation) and
``eval.max_prompt_tokens`` (the eval sets); a prompt within its limit never fails a job later.

That is verl's rule, not the released recipe's: the demystify dataset
(``recipe/demystify/reward.py``: ``CustomRLHFDataset._read_files_and_tokenize``) overrides the
only caller of verl's filter, for the training and validation files alike, so nothing is dropped
there, and ``data.truncation='error'`` makes the dataset raise when it loads a longer prompt.
``rollout.overlong_prompts: error`` reproduces that (the stage stops, naming the first prompt over
its limit, before any rollout rather than at the step that would load it); ``drop`` (both
presets) keeps the run going without them.

What is counted (``rollout.prompt_length_with_tools``): ``true`` (the embedded default) is the
prompt the agent loop feeds the model, the chat template's tool-schema block included, so a
kept prompt always fits the engine; ``false`` (the paper presets) is upstream's measure, the
messages rendered without the tool schema (verl's filter calls ``apply_chat_template`` without
``tools``), so a kept prompt can be that block (about 150 tokens for Qwen3) longer in the loop.

``python -m agentrl fit-prompts`` (:func:`agentrl.data.cli.fit_prompts_main`; the ``fit_rl_prompts`` and ``fit_eval_prompts`` rules)
writes the kept problems and ``results/data/prompt_lengths/{rl_pool,eval}.json``: per file, the
limit and the kept / dropped counts per data source.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.data.prompts import CODE_INTERPRETER_TOOL
from agentrl.data.records import Message, Problem, read_problems, write_records
from agentrl.errors import DataFormatError

log = logging.getLogger("agentrl.fit_prompts")


def rendered_prompt_ids(tokenizer, messages: Sequence[Message], with_tools: bool = True) -> list[int]:
    """The prompt ids: the messages in the chat template, with (or without) the tool schema."""
    tools = [CODE_INTERPRETER_TOOL] if with_tools else None
    text = tokenizer.apply_chat_template(list(messages), tools=tools, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def prompt_length(tokenizer, messages: Sequence[Message], with_tools: bool) -> int:
    """The length compared with the limit (see the module docstring)."""
    return len(rendered_prompt_ids(tokenizer, messages, with_tools))


def fit_problems(
    problems: Sequence[Problem], tokenizer, limit: int, with_tools: bool, overlong: str = "drop"
) -> tuple[list[Problem], dict[str, Any]]:
    """The problems whose prompt is at most ``limit`` tokens, and the counts per data source;
    ``overlong`` (``rollout.overlong_prompts``) ``error`` raises on the first one over it."""
    kept, kept_by, dropped_by, longest = [], Counter(), Counter(), 0
    for problem in problems:
        length = prompt_length(tokenizer, problem.prompt, with_tools)
        longest = max(longest, length)
        if length <= limit:  # upstream keeps doc2len(doc) <= max_prompt_length
            kept.append(problem)
            kept_by[problem.data_source] += 1
        elif overlong == "error":  # verl's RLHFDataset.__getitem__ with truncation='error'
            raise DataFormatError(
                f"problem {problem.id!r} ({problem.data_source}): the prompt is {length} tokens, longer than "
                f"{limit} (rollout.overlong_prompts: error, as the released recipe's dataset raises); "
                "set rollout.overlong_prompts: drop to leave such prompts out"
            )
        else:
            dropped_by[problem.data_source] += 1
    counts = {
        "limit": limit,
        "with_tools": with_tools,
        "kept": len(kept),
        "dropped": len(problems) - len(kept),
        "kept_by_source": dict(sorted(kept_by.items())),
        "dropped_by_source": dict(sorted(dropped_by.items())),
        "longest_prompt": longest,
    }
    return kept, counts


def fit_file(source: Path, out: Path, tokenizer, limit: int, with_tools: bool, overlong: str) -> dict[str, Any]:
    try:
        kept, counts = fit_problems(read_problems(source), tokenizer, limit, with_tools, overlong)
    except DataFormatError as exc:
        raise DataFormatError(f"{source}: {exc}") from None
    if not kept:
        raise DataFormatError(
            f"{source}: every prompt is over {limit} tokens (the longest has {counts['longest_prompt']}); "
            "raise the limit (rollout.max_prompt_tokens or eval.max_prompt_tokens)"
        )
    write_records(kept, out)
    log.info(
        "%s: kept %d, dropped %d over %d tokens %s",
        source,
        counts["kept"],
        counts["dropped"],
        limit,
        counts["dropped_by_source"],
    )
    return counts
