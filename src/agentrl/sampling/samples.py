"""Per-sample records of graded rollouts: what ``samples.jsonl`` holds, for evaluation and filtering.

One row per (problem, sample): the fields of :class:`agentrl.sampling.metrics.SampleRecord`
(correctness, extracted answer, tool-use counts) plus the reward score, the response text and
why the rollout ended, so a row can be audited without re-running anything.

Lengths: ``response_tokens`` counts the tokens the model generated (loss mask 1), so "tokens
per assistant turn" measures the model's own text; ``response_length`` counts every response
token, tool responses and template tokens included - the L of the overlong penalty.
``tokens_before_calls[j]`` is read from the turn structure: the response's model-generated
spans are the runs of loss-mask 1 (a tool response and the next assistant header are inserted
with mask 0 between them); span j ended with call j, and the tokens of span j before the
``<tool_call>`` marker are the thinking that preceded the call.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from agentrl.data.records import Problem, Trajectory
from agentrl.errors import DataFormatError
from agentrl.rewards import RewardResult
from agentrl.rollout.tool_parser import TOOL_CALL_START


def generated_spans(loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of 1s in the loss mask: the assistant turns, in order."""
    spans, start = [], None
    for position, bit in enumerate(loss_mask):
        if bit and start is None:
            start = position
        elif not bit and start is not None:
            spans.append((start, position))
            start = None
    if start is not None:
        spans.append((start, len(loss_mask)))
    return spans


def tokens_before_marker(token_ids: Sequence[int], tokenizer: Any, marker: str = TOOL_CALL_START) -> int | None:
    """Tokens of ``token_ids`` that precede the first ``marker`` in their decoded text (None: no marker).

    Decodes prefixes and bisects on the decoded length, so it holds whether the marker is one
    added token (Qwen, the embedded tokenizer) or several ordinary ones.
    """
    text = tokenizer.decode(list(token_ids), skip_special_tokens=False)
    at = text.find(marker)
    if at < 0:
        return None
    low, high = 0, len(token_ids)  # smallest m whose prefix decodes past the marker's first character
    while low < high:
        middle = (low + high) // 2
        if len(tokenizer.decode(list(token_ids[: middle + 1]), skip_special_tokens=False)) > at:
            high = middle
        else:
            low = middle + 1
    return low


def tokens_before_calls(trajectory: Trajectory, tokenizer: Any) -> list[int]:
    """Model-text tokens before each executed tool call (the call's own text excluded)."""
    spans = generated_spans(trajectory.loss_mask)
    calls = len(trajectory.tool_calls)
    where = f"problem {trajectory.problem_id!r} sample {trajectory.sample_index}"
    assert len(spans) >= calls, (
        f"{where}: {calls} tool calls but only {len(spans)} model-generated spans in the loss mask"
    )
    counts = []
    for start, end in spans[:calls]:
        before = tokens_before_marker(trajectory.response_ids[start:end], tokenizer)
        # The agent loop also answers a turn that closes a call it never opened (</tool_call>
        # alone) with an error; that turn has no marker, and all of it preceded the failed call.
        counts.append(end - start if before is None else before)
    return counts


def sample_row(problem: Problem, trajectory: Trajectory, reward: RewardResult, tokenizer: Any) -> dict[str, Any]:
    """The samples.jsonl row of one graded rollout (a superset of SampleRecord's fields)."""
    assert trajectory.problem_id == problem.id, (
        f"trajectory of {trajectory.problem_id!r} paired with problem {problem.id!r}"
    )
    assert len(trajectory.tool_errors) == len(trajectory.tool_calls), (
        f"problem {problem.id!r} sample {trajectory.sample_index}: "
        f"{len(trajectory.tool_calls)} tool calls but {len(trajectory.tool_errors)} error flags"
    )
    return {
        "problem_id": problem.id,
        "sample_index": trajectory.sample_index,
        "data_source": problem.data_source,
        "acc": bool(reward.acc),
        "score": float(reward.score),
        "pred": reward.pred,
        "tool_calls": len(trajectory.tool_calls),
        "tool_errors": [bool(e) for e in trajectory.tool_errors],
        "tokens_before_calls": tokens_before_calls(trajectory, tokenizer),
        "num_turns": int(trajectory.num_turns),
        "response_tokens": int(sum(trajectory.loss_mask)),
        "response_length": len(trajectory.response_ids),
        "finish_reason": trajectory.finish_reason,
        "tool_outcomes": list(trajectory.tool_outcomes),
        "attempts": int(trajectory.attempts),
        "infra_failed": bool(trajectory.infra_failed),
        "reward_details": reward.to_json()["details"],
        "text": trajectory.text,
    }


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | Path) -> int:
    """Write rows atomically (a killed job never leaves a complete-looking partial file); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    count = 0
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    tmp.replace(path)
    return count


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """The rows of a JSON-lines file; a line that is not a JSON object raises DataFormatError naming
    the file, the line and the column (a missing file too)."""
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise DataFormatError(f"{path}: cannot be read ({exc.strerror})") from None
    with fh:
        number = 0
        try:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line.rstrip("\r\n"))
                except json.JSONDecodeError as exc:
                    raise DataFormatError(
                        f"{path}: line {number}, column {exc.colno}: not valid JSON ({exc.msg})"
                    ) from None
                if not isinstance(row, dict):
                    raise DataFormatError(f"{path}: line {number}: expected a JSON object, got {type(row).__name__}")
                yield row
        except UnicodeDecodeError as exc:
            raise DataFormatError(f"{path}: line {number + 1}: not UTF-8 text ({exc.reason})") from None
