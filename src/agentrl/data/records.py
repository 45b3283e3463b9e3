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

from agentrl.errors import DataFormatError

Message = dict[str, Any]
PROBLEM_COLUMNS = ("id", "data_source", "prompt", "ability", "ground_truth", "extra")
# The ``extra`` key of a row whose ground truth these checks refuse but which prepare-data kept,
# because the config grades such rows as upstream does (reward.invalid_ground_truth: score); its
# value says what the check found. The stages that read the file take it as it is.
KEPT_AS_RELEASED = "kept_as_released"
SFT_COLUMNS = ("id", "messages", "tools")


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
    finish_reason: str  # stop | length | max_turns | infra_failure (the sandbox lost a call of the retry too)
    reward: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Per call: what it came to (agentrl.tools.sandbox.OUTCOMES), seconds waiting for a worker, running.
    tool_outcomes: list[str] = field(default_factory=list)
    tool_queue_s: list[float] = field(default_factory=list)
    tool_run_s: list[float] = field(default_factory=list)
    attempts: int = 1  # 2: rolled out again after the sandbox lost a call (same sample seeds)
    infra_failed: bool = False  # the retry lost one too: left out of advantages, pass rates, metrics

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Trajectory:
        return cls(**obj)


def write_records(records: list[Problem] | list[SftExample], path: str | Path) -> None:
    write_parquet(pd.DataFrame([r.to_row() for r in records]), path)


def write_parquet(frame: pd.DataFrame, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(path)  # a killed job never leaves a half-written parquet that looks complete


def read_parquet(path: str | Path, what: str) -> pd.DataFrame:
    """The table of a parquet file; a missing or damaged file is a DataFormatError naming ``path``."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: the {what} file does not exist")
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds for a damaged file
        raise DataFormatError(f"{path}: not a readable parquet file ({type(exc).__name__}: {exc})") from None


def read_problems(path: str | Path) -> list[Problem]:
    """The problems of a normalized parquet; a bad file, row or column raises DataFormatError naming it."""
    rows = _read_table(path, PROBLEM_COLUMNS, "problem")
    return [_problem(_Cells(path, index, row)) for index, row in enumerate(rows)]


def read_sft_examples(path: str | Path) -> list[SftExample]:
    """The SFT examples of a normalized parquet; errors as :func:`read_problems`."""
    rows = _read_table(path, SFT_COLUMNS, "SFT")
    return [_sft_example(_Cells(path, index, row)) for index, row in enumerate(rows)]


def _read_table(path: str | Path, columns: tuple[str, ...], what: str) -> list[dict[str, Any]]:
    frame = read_parquet(path, what)
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise DataFormatError(
            f"{path}: column(s) {missing} missing (columns present: {list(frame.columns)}); "
            f"a normalized {what} file has {list(columns)}"
        )
    if frame.empty:
        raise DataFormatError(f"{path}: no rows (an empty {what} file)")
    return frame.to_dict("records")


class _Cells:
    """One row's columns, with errors that name the file, the row and the column."""

    def __init__(self, path: str | Path, index: int, row: dict[str, Any]):
        self.path, self.index, self.row = path, index, row

    def error(self, column: str, problem: str) -> DataFormatError:
        return DataFormatError(f"{self.path}: row {self.index}, column '{column}': {problem}")

    def text(self, column: str) -> str:
        value = self.row[column]
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.error(column, f"expected a string, got {type(value).__name__}: {value!r:.80}")
        return str(value)

    def json(self, column: str, kind: type | tuple[type, ...]) -> Any:
        raw = self.row[column]
        if not isinstance(raw, str):
            raise self.error(column, f"expected a JSON string, got {type(raw).__name__}: {raw!r:.80}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            problem = f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): {raw!r:.80}"
            raise self.error(column, problem) from None
        if not isinstance(value, kind):
            names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise self.error(column, f"expected {names}, got {type(value).__name__}: {raw!r:.80}")
        return value

    def messages(self, column: str) -> list[Message]:
        messages = self.json(column, list)
        for number, message in enumerate(messages):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)):
                raise self.error(column, f"message {number} is not an object with a 'role': {message!r:.80}")
        return messages


def _problem(cells: _Cells) -> Problem:
    problem = Problem(
        id=cells.text("id"),
        data_source=cells.text("data_source"),
        prompt=cells.messages("prompt"),
        ability=cells.text("ability"),
        ground_truth=cells.json("ground_truth", (str, dict, int, float)),
        extra=cells.json("extra", dict),
    )
    fault = problem_fault(problem)
    if fault is not None:
        raise cells.error(fault[0], fault[1])
    return problem


def problem_fault(problem: Problem) -> tuple[str, str] | None:
    """(column, what is wrong) when a problem cannot be rolled out or graded, else None: a prompt
    without a non-empty user turn, an empty ground truth, code tests whose inputs and outputs
    differ in number. Checked when the data is prepared and again whenever a file is read; what a
    particular verifier needs more (a multiple-choice letter among the prompt's options) is
    :mod:`agentrl.rewards.ground_truth`'s, checked by the stages that grade. The ground truth of a
    row marked :data:`KEPT_AS_RELEASED` is not checked."""
    users = [m.get("content") for m in problem.prompt if m.get("role") == "user"]
    if not any(isinstance(content, str) and content.strip() for content in users):
        return "prompt", "no user message with text (an empty prompt)"
    if problem.extra.get(KEPT_AS_RELEASED):
        return None
    truth = problem.ground_truth
    if isinstance(truth, str) and not truth.strip():
        return "ground_truth", "empty (nothing to grade against)"
    if isinstance(truth, dict) and isinstance(truth.get("inputs"), list) and isinstance(truth.get("outputs"), list):
        if len(truth["inputs"]) != len(truth["outputs"]):
            return "ground_truth", (
                f"{len(truth['inputs'])} test inputs but {len(truth['outputs'])} outputs (each input needs its output)"
            )
        if not truth["inputs"]:
            return "ground_truth", "no test cases (empty inputs and outputs)"
    return None


def check_problems(problems: list[Problem], what: str) -> None:
    """Raise DataFormatError naming the row and column of the first problem with a
    :func:`problem_fault` (the prepare stage, before anything is written)."""
    for index, problem in enumerate(problems):
        fault = problem_fault(problem)
        if fault is not None:
            raise DataFormatError(f"{what}: row {index} (id {problem.id!r}), column '{fault[0]}': {fault[1]}")


def _sft_example(cells: _Cells) -> SftExample:
    return SftExample(id=cells.text("id"), messages=cells.messages("messages"), tools=cells.json("tools", list))
