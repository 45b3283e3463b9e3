"""Loaders for the data released with the paper (docs/recipe.md section 1), into normalized records.

Sources are a Hugging Face hub dataset id plus a file inside it and a revision
(``Gen-Verse/Open-AgentRL-30K``, ``Open-AgentRL-30K.parquet``; the file comes from the hub cache,
:mod:`agentrl.hub`) or a local ``.parquet`` / ``.jsonl`` / ``.json`` path. Both are read with
``datasets`` when the rule runs, never while Snakemake builds the DAG.

Normalization applies the recipe's prompt templates (section 2): AIME and GPQA wrappings,
LiveCodeBench's stdin/stdout instructions, and the per-data-source wrapping of RL rows. Every
problem raises :class:`DataFormatError` naming the file, the row and the column, so a broken
row is found without guessing; nothing is dropped silently. Two reward keys reach back here:
``reward.code_ground_truth: literal_eval`` keeps a code ground truth as the file stores it (upstream's
code_math grades ``str()`` of it), and ``reward.invalid_ground_truth: score`` keeps a code or GPQA
answer the project refuses as upstream reads it; prepare-data then marks and counts such rows
(:func:`agentrl.rewards.ground_truth.checked_problems`).

SFT tool calls whose ``arguments`` the file stores as a JSON string are decoded
(``data.upstream.sft_tool_arguments: parsed``, a deliberate departure), so the chat template
serializes every call's arguments one way (``tojson``) whatever the file's spelling; upstream's multiturn SFT dataset hands the messages to the template as stored, and the template
writes a string verbatim (``as_stored``, the as-released overlay).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentrl.config import SourceConfig
from agentrl.data import prompts
from agentrl.data.records import Message, Problem, SftExample
from agentrl.errors import DataFormatError

__all__ = ["DataFormatError", "read_rows", "source_name"]

ROLES = ("system", "user", "assistant", "tool")


def _is_local(source_id: str) -> bool:
    return Path(source_id).expanduser().exists() or source_id.endswith((".parquet", ".jsonl", ".json"))


def source_name(source: SourceConfig) -> str:
    return source.id if _is_local(source.id) else f"{source.id}/{source.file or ''}"


def read_rows(source: SourceConfig, limit: int | None = None, key: str = "data source") -> list[dict[str, Any]]:
    """All rows of a source as plain dicts (nested structs and lists become Python objects);
    ``key`` is the source's config key, named when a hub source cannot be fetched."""
    import datasets  # heavy import, needed only when upstream data is asked for

    if _is_local(source.id):
        path = Path(source.id).expanduser()
        if not path.exists():
            raise DataFormatError(f"data source {source.id!r} does not exist")
    else:  # through the hub cache, at the pinned revision (offline when HF_HUB_OFFLINE=1)
        from agentrl.hub import dataset_file

        path = dataset_file(source, key)
    builder = "parquet" if path.suffix == ".parquet" else "json"
    if builder == "json":
        _check_json_rows(path)  # datasets' own error names neither the file nor the row
    try:
        table = datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as exc:  # noqa: BLE001 - pyarrow and datasets raise many kinds for a damaged file
        raise DataFormatError(f"{path}: cannot be read as {builder} ({type(exc).__name__}: {exc})") from None
    rows = table.to_list()
    if not rows:
        raise DataFormatError(f"{path}: no rows")
    return rows[:limit] if limit else rows


def _check_json_rows(path: Path) -> None:
    """Raise DataFormatError naming the line and column of the first row that is not a JSON object."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if text.lstrip().startswith("["):  # one JSON array of rows
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{path}: line {exc.lineno}, column {exc.colno}: not JSON ({exc.msg})") from None
        bad = (
            next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None) if isinstance(rows, list) else 0
        )
        if bad is not None:
            raise DataFormatError(f"{path}: row {bad} is not a JSON object")
        return
    if not text.strip():
        raise DataFormatError(f"{path}: no rows")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{path}: line {number}, column {exc.colno}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DataFormatError(f"{path}: line {number}: a row must be a JSON object, got {type(row).__name__}")


class _Row:
    """Access to one row's columns with errors that say where the problem is."""

    def __init__(self, origin: str, index: int, row: dict[str, Any]):
        self.origin, self.index, self.row = origin, index, row

    def error(self, column: str, problem: str) -> DataFormatError:
        return DataFormatError(f"{self.origin}: row {self.index}, column '{column}': {problem}")

    def get(self, column: str, kind: type | tuple[type, ...] = object) -> Any:
        if column not in self.row:
            raise self.error(column, f"missing (columns present: {sorted(self.row)})")
        value = self.row[column]
        if value is None:  # datasets fills a key absent from a JSON row with null
            raise self.error(column, "missing (null in this row)")
        if not isinstance(value, kind):
            raise self.error(
                column, f"expected {getattr(kind, '__name__', kind)}, got {type(value).__name__}: {value!r:.80}"
            )
        return value

    def json(self, column: str, value: Any = None) -> Any:
        """A column that upstream stores either as a JSON string or as the parsed structure."""
        value = self.get(column) if value is None else value
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise self.error(column, f"not valid JSON ({exc})") from None
        return value


def _iter_rows(rows: list[dict[str, Any]], origin: str) -> Iterator[_Row]:
    for index, row in enumerate(rows):
        yield _Row(origin, index, row)


def _drop_nulls(obj: Any) -> Any:
    """Parquet struct columns carry every key seen in any row; a null means 'absent here'."""
    if isinstance(obj, dict):
        return {k: _drop_nulls(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_drop_nulls(v) for v in obj]
    return obj


# --------------------------------------------------------------------------- SFT
def _normalize_message(row: _Row, i: int, message: Any, tool_arguments: str) -> Message:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise row.error("messages", f"{where} is a {type(message).__name__}, expected an object")
    message = _drop_nulls(message)
    role = message.get("role")
    if role not in ROLES:
        raise row.error("messages", f"{where}.role = {role!r}; expected one of {list(ROLES)}")
    if role == "system" and i != 0:
        raise row.error("messages", f"{where} is a system message; only messages[0] may be")
    out: Message = {"role": role, "content": message.get("content") or ""}
    calls = message.get("tool_calls") or []
    if calls and role != "assistant":
        raise row.error("messages", f"{where} has tool_calls but role {role!r}")
    normalized_calls = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or "name" not in function:
            raise row.error("messages", f"{where}.tool_calls[{j}] has no function name")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                decoded = json.loads(arguments)
            except json.JSONDecodeError as exc:
                raise row.error("messages", f"{where}.tool_calls[{j}].function.arguments is not JSON ({exc})") from None
            # as_stored: upstream's multiturn SFT dataset hands the string to the template, which
            # renders it verbatim (its spacing and escapes), where a dict is re-serialized by tojson
            arguments = arguments if tool_arguments == "as_stored" and isinstance(decoded, dict) else decoded
        if not isinstance(arguments, dict | str):
            raise row.error("messages", f"{where}.tool_calls[{j}].function.arguments is not an object")
        normalized_calls.append({"type": "function", "function": {"name": function["name"], "arguments": arguments}})
    if normalized_calls:
        out["tool_calls"] = normalized_calls
    return out


def normalize_sft(rows: list[dict[str, Any]], origin: str, tool_arguments: str = "parsed") -> list[SftExample]:
    """SFT rows -> examples; ``tool_arguments`` is ``data.upstream.sft_tool_arguments``."""
    examples = []
    for row in _iter_rows(rows, origin):
        messages = row.json("messages")
        if not isinstance(messages, list) or not messages:
            raise row.error("messages", "expected a non-empty list of messages")
        normalized = [_normalize_message(row, i, m, tool_arguments) for i, m in enumerate(messages)]
        if not any(m["role"] == "assistant" for m in normalized):
            raise row.error("messages", "no assistant message: nothing to train on")
        tools = _drop_nulls(row.json("tools"))
        if not isinstance(tools, list):
            raise row.error("tools", "expected a list of tool schemas")
        for tool in tools:
            if isinstance(tool, dict) and isinstance(tool.get("function", {}).get("parameters"), str):
                tool["function"]["parameters"] = row.json("tools", tool["function"]["parameters"])
        examples.append(SftExample(id=str(row.row.get("id", f"sft-{row.index:06d}")), messages=normalized, tools=tools))
    return examples


# --------------------------------------------------------------------------- RL pool
def _ground_truth(row: _Row, data_source: str, value: Any, raw_code: bool, keep: bool) -> str | dict[str, Any]:
    """A row's ground truth; a code one decoded from JSON unless ``raw_code`` (upstream's code_math
    grades ``str()`` of what the file stores), or kept as stored when ``keep`` and it is no JSON
    object of tests (the grader scores it as upstream does)."""
    if "code" in data_source.lower():
        stored = value if isinstance(value, str | dict) else str(value)
        if raw_code:
            return stored
        try:
            truth = row.json("reward_model", value)
        except DataFormatError:
            if keep:
                return stored
            raise
        has_io = isinstance(truth, dict) and "inputs" in truth and "outputs" in truth
        has_check = isinstance(truth, dict) and "test_code" in truth and "entry_point" in truth
        if keep and not (has_io or has_check):
            return stored
        if not isinstance(truth, dict):
            raise row.error("reward_model", "code ground_truth must be a JSON object")
        if not (has_io or has_check):
            raise row.error("reward_model", "code ground_truth needs inputs/outputs or entry_point/test_code")
        return truth
    if not isinstance(value, (str, int, float)):
        raise row.error("reward_model", f"ground_truth must be a string, got {type(value).__name__}")
    return str(value)


EVAL_SOURCES = ("AIME2024", "AIME2025", "gpqa_diamond", "LiveCodeBench_v6")


def _rl_wrapper(rows: list[dict[str, Any]], origin: str, wrapping: str):
    """``wrap(content, data_source)`` of ``data.upstream.rl_prompt_wrapping``."""
    if wrapping == "per_row" or not rows:
        return prompts.rl_prompt
    first = _Row(origin, 0, rows[0]).get("data_source", str)
    if first in EVAL_SOURCES:  # upstream would map the file with that benchmark's eval columns
        raise DataFormatError(
            f"{origin}: row 0, column 'data_source': {first!r} is an eval benchmark's source; with "
            "data.upstream.rl_prompt_wrapping: per_file the first row picks the wrapping of the whole RL file"
        )
    return prompts.rl_file_wrapper(first)


def normalize_rl(
    rows: list[dict[str, Any]], origin: str, wrapping: str = "per_row", raw_code: bool = False, keep: bool = False
) -> list[Problem]:
    """RL-pool rows -> problems; ``wrapping`` is ``data.upstream.rl_prompt_wrapping``, ``raw_code``
    ``reward.code_ground_truth: literal_eval`` and ``keep`` ``reward.invalid_ground_truth: score``."""
    wrap = _rl_wrapper(rows, origin, wrapping)
    problems = []
    for row in _iter_rows(rows, origin):
        data_source = row.get("data_source", str)
        prompt = row.json("prompt")
        if not isinstance(prompt, list) or len(prompt) != 1 or not isinstance(prompt[0], dict):
            raise row.error("prompt", "expected a list with one user message")
        content = prompt[0].get("content")
        if prompt[0].get("role") != "user" or not isinstance(content, str):
            raise row.error("prompt", "expected one {role: user, content: <string>} message")
        if not content.strip():  # the wrapping below would make it a prompt that asks nothing
            raise row.error("prompt", "the user message is blank (empty or whitespace); fill it or drop the row")
        reward_model = row.json("reward_model")
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise row.error("reward_model", "expected an object with a ground_truth key")
        extra = _drop_nulls(row.json("extra_info")) if row.row.get("extra_info") is not None else {}
        index = extra.get("index", row.index) if isinstance(extra, dict) else row.index
        problems.append(
            Problem(
                id=f"{data_source}-{index}",
                data_source=data_source,
                prompt=[{"role": "user", "content": wrap(content, data_source)}],
                ability=str(row.row.get("ability") or ""),
                ground_truth=_ground_truth(row, data_source, reward_model["ground_truth"], raw_code, keep),
                extra=extra if isinstance(extra, dict) else {"extra_info": extra},
            )
        )
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):  # extra_info.index is not unique across data sources everywhere
        problems = [
            Problem(f"{p.id}-r{i}", p.data_source, p.prompt, p.ability, p.ground_truth, p.extra)
            for i, p in enumerate(problems)
        ]
    return problems


# --------------------------------------------------------------------------- eval sets
def _question(row: _Row, column: str) -> str:
    """A row's question; a blank one would be wrapped into a prompt that asks nothing."""
    text = row.get(column, str)
    if not text.strip():
        raise row.error(column, "blank (empty or whitespace): no question to ask; fill it or drop the row")
    return text


def _aime(row: _Row, problem_col: str, answer_col: str) -> tuple[str, Any, str]:
    return prompts.aime_prompt(_question(row, problem_col)), str(row.get(answer_col, (str, int))), "math"


def _aime2024(row: _Row, keep: bool):
    return _aime(row, "Problem", "Answer")


def _aime2025(row: _Row, keep: bool):
    return _aime(row, "problem", "answer")


def _gpqa(row: _Row, keep: bool):
    """``keep``: the answer as upstream's ``str(answer)``, whatever it is (the grading stages mark it)."""
    letter = str(row.get("solution")) if keep else row.get("solution", str).strip()
    if letter not in ("A", "B", "C", "D") and not keep:
        raise row.error("solution", f"expected one letter A-D, got {letter!r}")
    return prompts.gpqa_prompt(_question(row, "problem"), row.get("domain", str)), letter, "science"


def _livecodebench(row: _Row, keep: bool):
    reward_model = row.json("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    truth = row.json("reward_model", truth) if isinstance(truth, str) else truth
    # upstream's map_lcb indexes both lists for the prompt; an empty one is graded (-1) when kept
    if not isinstance(truth, dict) or not (keep or truth.get("inputs")) or not {"inputs", "outputs"} <= truth.keys():
        raise row.error("reward_model", "expected ground_truth.inputs / ground_truth.outputs")
    # Upstream's map_lcb writes str() of the whole ground_truth.inputs / .outputs lists.
    content = prompts.lcb_prompt(_question(row, "problem"), truth["inputs"], truth["outputs"])
    return content, truth, "code"


EVAL_LOADERS: dict[str, tuple[str, Callable[[_Row, bool], tuple[str, Any, str]]]] = {
    "aime2024": ("AIME2024", _aime2024),
    "aime2025": ("AIME2025", _aime2025),
    "gpqa_diamond": ("gpqa_diamond", _gpqa),
    "livecodebench_v6": ("LiveCodeBench_v6", _livecodebench),
}


def normalize_eval(benchmark: str, rows: list[dict[str, Any]], origin: str, keep: bool = False) -> list[Problem]:
    """Eval rows -> problems; ``keep`` (``reward.invalid_ground_truth: score``) keeps an answer
    the project refuses as upstream reads it."""
    if benchmark not in EVAL_LOADERS:
        raise DataFormatError(f"{origin}: no loader for benchmark {benchmark!r}; known: {sorted(EVAL_LOADERS)}")
    default_source, loader = EVAL_LOADERS[benchmark]
    problems = []
    for row in _iter_rows(rows, origin):
        content, truth, ability = loader(row, keep)
        data_source = row.row.get("data_source") or default_source
        # Keep the file's own metadata (LiveCodeBench's question_id, dates): the official
        # evaluator matches submissions by it.
        info = row.json("extra_info") if row.row.get("extra_info") is not None else {}
        info = _drop_nulls(info) if isinstance(info, dict) else {"extra_info": info}
        problems.append(
            Problem(
                id=f"{benchmark}-{row.index:04d}",
                data_source=str(data_source),
                prompt=[{"role": "user", "content": content}],
                ability=ability,
                ground_truth=truth,
                extra={**info, "benchmark": benchmark, "index": row.index},
            )
        )
    return problems
