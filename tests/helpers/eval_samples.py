"""Synthetic evaluation samples (the rows of a samples.jsonl) for the report's tests."""

from __future__ import annotations

import random


def synthetic_samples(
    accuracy: float,
    problems: int = 6,
    n: int = 4,
    seed: int = 0,
    *,
    with_answers: bool = True,
    response_tokens: tuple[int, int] = (100, 900),
) -> list[dict]:
    """``problems`` x ``n`` samples right with probability ``accuracy``, with 0-4 tool calls each;
    ``with_answers`` False: no sample has an answer the verifier read (``pred`` None)."""
    rng = random.Random(seed)
    rows = []
    for p in range(problems):
        for i in range(n):
            calls = rng.randint(0, 4)
            rows.append(
                {
                    "problem_id": f"q{p}",
                    "sample_index": i,
                    "acc": rng.random() < accuracy,
                    "pred": str(rng.randint(0, 2)) if with_answers else None,
                    "tool_calls": calls,
                    "tool_errors": [rng.random() < 0.3 for _ in range(calls)],
                    "tokens_before_calls": [rng.randint(10, 400) for _ in range(calls)],
                    "num_turns": calls + 1,
                    "response_tokens": rng.randint(*response_tokens),
                }
            )
    return rows
