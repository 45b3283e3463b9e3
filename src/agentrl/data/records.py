"""Normalized records: one schema for every data source (docs/design.md "Normalized records").

- :class:`Problem`: a prompt to solve and how to grade it (RL pool, eval sets).
- :class:`SftExample`: a multi-turn conversation with tool calls, for SFT.
- :class:`Trajectory`: one agentic rollout, with the loss mask made by the agent loop.

Parquet columns hold plain types only. ``prompt``/``messages``/``tools`` and ``extra`` are stored
as JSON strings: upstream parquet struct columns carry extra null keys and differing shapes
across rows, which Arrow would otherwise widen or refuse. ``ground_truth`` is a string for
math/choice and a dict for code, so it is stored as JSON too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

Message = dict[str, Any]


@dataclass(frozen=True)
class Problem:
    id: str
    data_source: str
    prompt: list[Message]
    ability: str
    ground_truth: str | dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "data_source": self.data_source,
            "prompt": json.dumps(self.prompt, ensure_ascii=False),
            "ability": self.ability,
            "ground_truth": json.dumps(self.ground_truth, ensure_ascii=False),
            "extra": json.dumps(self.extra, ensure_ascii=False),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Problem:
        return cls(
            id=str(row["id"]),
            data_source=str(row["data_source"]),
            prompt=json.loads(row["prompt"]),
            ability=str(row["ability"]),
            ground_truth=json.loads(row["ground_truth"]),
            extra=json.loads(row["extra"]),
        )


@dataclass(frozen=True)
class SftExample:
    id: str
    messages: list[Message]
    tools: list[dict[str, Any]]

    def to_row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "messages": json.dumps(self.messages, ensure_ascii=False),
            "tools": json.dumps(self.tools, ensure_ascii=False),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> SftExample:
        return cls(id=str(row["id"]), messages=json.loads(row["messages"]), tools=json.loads(row["tools"]))


@dataclass
class Trajectory:
    """One rollout. ``loss_mask[i] == 1`` iff ``response_ids[i]`` was sampled by the model."""

    problem_id: str
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]  # sampling log-prob per response token (0.0 where loss_mask == 0)
    text: str
    num_turns: int
    tool_calls: list[str]  # the code of each executed call, in order
    tool_errors: list[bool]  # per call: True when the call failed (bad call, exception, timeout)
    finish_reason: str  # stop | length | max_turns
    reward: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Trajectory:
        return cls(**obj)


def write_records(records: list[Problem] | list[SftExample], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame([r.to_row() for r in records])
    tmp = path.with_suffix(path.suffix + ".tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(path)  # a killed job never leaves a half-written parquet that looks complete


def read_problems(path: str | Path) -> list[Problem]:
    frame = pd.read_parquet(path)
    return [Problem.from_row(row) for row in frame.to_dict("records")]


def read_sft_examples(path: str | Path) -> list[SftExample]:
    frame = pd.read_parquet(path)
    return [SftExample.from_row(row) for row in frame.to_dict("records")]
