"""Export code-benchmark samples in the input format of LiveCodeBench's official custom evaluator.

The project grades code with its own verifier (``agentrl.rewards.code_verifier``: last fenced
python block, stdin/stdout cases in the sandbox). So that a user can check those numbers with
the official harness, code benchmarks (LiveCodeBench-v6 and the embedded ``program`` family)
also get ``livecodebench_custom_outputs.json``, the file LiveCodeBench's
``lcb_runner/runner/custom_evaluator.py`` reads with ``--custom_output_file``: a JSON list with
one object per question, ``{"question_id": str, "code_list": [code of sample 0, 1, ...]}``.
The evaluator sorts the list by ``question_id`` itself and requires exactly one entry per
question of the benchmark window it loads, so every problem of the set is written, and a
sample without a code block gets an empty string (graded as a failure, as here).

``code_list`` holds the *extracted* code (what the verifier ran; the evaluator treats the list
as already-extracted outputs). ``question_id`` is the problem's ``extra["question_id"]`` when
the eval loader kept it (LiveCodeBench's own id), else the project's problem id (the embedded
set has no official counterpart). For the paper's set (Open-AgentRL-Eval, 2025-02 to 2025-05)
the official run is along the lines of::

    python -m lcb_runner.runner.custom_evaluator --custom_output_file livecodebench_custom_outputs.json \\
        --scenario codegeneration --release_version release_v6 --start_date 2025-02-01 --end_date 2025-05-31

(check the date window against the number of questions the evaluator asserts).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.data.records import Problem
from agentrl.errors import DataFormatError
from agentrl.rewards import family_of

EXPORT_NAME = "livecodebench_custom_outputs.json"


def custom_outputs(
    problems: Sequence[Problem], rows: Iterable[Mapping[str, Any]], source: str = "samples"
) -> list[dict[str, Any]]:
    """One ``{"question_id", "code_list"}`` per problem, samples in ``sample_index`` order."""
    not_code = sorted({p.data_source for p in problems if family_of(p.data_source) != "code"})
    if not_code:
        raise DataFormatError(
            f"{source}: LiveCodeBench export needs code problems; data sources {not_code} are not code"
        )
    codes: dict[str, dict[int, str]] = {p.id: {} for p in problems}
    for number, row in enumerate(rows):
        missing = [key for key in ("problem_id", "sample_index", "pred") if key not in row]
        if missing:
            raise DataFormatError(f"{source} row {number}: key(s) {missing} missing")
        problem_id = row["problem_id"]
        if problem_id not in codes:
            raise DataFormatError(f"{source} row {number}: problem {problem_id!r} is not in the benchmark")
        pred = row["pred"]
        if pred is not None and not isinstance(pred, str):
            raise DataFormatError(
                f"{source} row {number}: 'pred' must be the extracted code (a string) or null, got {pred!r}"
            )
        codes[problem_id][int(row["sample_index"])] = pred or ""
    counts = {pid: len(c) for pid, c in codes.items()}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        raise DataFormatError(f"{source}: every problem needs the same number (>= 1) of samples; got {counts}")
    ids = [str(p.extra.get("question_id", p.id)) for p in problems]
    if len(set(ids)) != len(ids):
        raise DataFormatError(f"{source}: question ids repeat; LiveCodeBench matches outputs to questions by id")
    return [
        {"question_id": qid, "code_list": [codes[p.id][i] for i in sorted(codes[p.id])]}
        for qid, p in zip(ids, problems)
    ]


def write_custom_outputs(outputs: list[dict[str, Any]], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(outputs, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
