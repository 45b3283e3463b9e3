"""benchmarks/gpu_check.sh's account of its parts: each part's outcome with what it skipped and why,
and the exit status of the call.

    python benchmarks/gpu_check_report.py part PART CODE CAP SECONDS SUMMARY RESULTS   # one part (SECONDS "-": not run)
    python benchmarks/gpu_check_report.py final RESULTS                                # the call's end

``part`` reads the exit status a part's script gave under ``timeout`` (124 or 137: killed at its
cap), and its summary JSON where there is one (part 1: ``{"status": ...}`` or the figures with
``error``; parts 2 and 3: one ``{"status": ...}`` per sub-part; part 4: the figures), prints one
line per part and one per sub-part that did not pass, and appends a record to ``RESULTS``.
``final`` prints every part's outcome again and exits:

- **0** every part and sub-part passed;
- **1** a part failed, ran past its cap, was not started for lack of time, or was skipped for a
  reason that the right wheel in benchmarks/gpu_carry.sh's folder would remove (DeepSpeed missing,
  say): a skip is never a pass;
- **3** nothing failed, and what was skipped truly cannot run on this machine: it needs vLLM
  (CUDA vLLM is too large for the wheel folder copied to a GPU node without a package index), or
  CUDA on a CPU run (``GPU_CHECK_ALLOW_CPU=1``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

TIMED_OUT = (124, 137)  # GNU timeout: the command ran past its limit (137: killed after --kill-after)
SKIP_CODE = 3  # a part's own "nothing failed, something skipped"
NOT_STARTED = -1  # gpu_check.sh: not enough of the call's time left to start the part
SUB_PARTS = {"2": {"a_engine": "2a", "b_long_sequence": "2b", "c_decode": "2c"}, "3": {"a": "3a", "b": "3b", "c": "3c"}}


def skip_kind(reason: str, allow_cpu: bool) -> str:
    """``"vllm"``, ``"cuda"`` (acceptable skips) or ``"other"`` (counts as a failure) for a
    ``"skipped: ..."`` status."""
    if "vllm not importable" in reason:
        return "vllm"
    if allow_cpu and "no CUDA device" in reason:
        return "cuda"
    return "other"


def read_summary(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def sub_statuses(part: str, summary: dict[str, Any] | None) -> dict[str, str]:
    """Each sub-part's status (``passed``, ``failed: ...``, ``skipped: ...``) from the part's summary."""
    if summary is None:
        return {}
    if part in SUB_PARTS:
        return {name: summary[key]["status"] for key, name in SUB_PARTS[part].items() if key in summary}
    if isinstance(summary.get("status"), str):  # part 1 or 4 skipped by gpu_check.sh
        return {part: summary["status"]}
    if "error" in summary:
        return {part: f"failed: {summary['error']}"}
    return {}


def outcome(part: str, code: int, cap: int, summary: dict[str, Any] | None, allow_cpu: bool) -> dict[str, Any]:
    """``{"part", "result": passed | failed | skipped | skipped-ok, "why", "subs": {...}}``.

    ``skipped-ok``: only skips that need vLLM (or CUDA on a CPU run); ``skipped``: some other
    skip, which counts as a failure."""
    subs = sub_statuses(part, summary)
    if code == NOT_STARTED:
        return {"part": part, "result": "failed", "why": "not started: too little of the call's time left", "subs": {}}
    if code in TIMED_OUT:
        return {"part": part, "result": "failed", "why": f"killed at its cap of {cap} s", "subs": subs}
    failed = {k: v for k, v in subs.items() if v.startswith("failed")}
    skips = {k: skip_kind(v, allow_cpu) for k, v in subs.items() if v.startswith("skipped")}
    if code not in (0, SKIP_CODE) or failed:
        why = f"exit {code}" + (f": {'; '.join(f'{k} {v}' for k, v in failed.items())}" if failed else "")
        return {"part": part, "result": "failed", "why": why, "subs": subs}
    if code == SKIP_CODE and not skips:
        return {
            "part": part,
            "result": "failed",
            "why": "exit 3 without a skipped sub-part in its summary",
            "subs": subs,
        }
    if any(kind == "other" for kind in skips.values()):
        return {"part": part, "result": "skipped", "why": "counts as failed: see the skipped parts", "subs": subs}
    if skips:
        return {"part": part, "result": "skipped-ok", "why": "only what this machine cannot run", "subs": subs}
    return {"part": part, "result": "passed", "why": "", "subs": subs}


def describe(record: dict[str, Any], allow_cpu: bool) -> list[str]:
    """The lines a part's outcome prints: the part, then each sub-part that did not pass."""
    seconds = f" in {record['seconds']} s of its {record['cap']} s cap" if record.get("seconds") is not None else ""
    head = f"gpu_check: part {record['part']}: {record['result'].upper()}{seconds}"
    lines = [head + (f" ({record['why']})" if record["why"] else "")]
    for name, status in record["subs"].items():
        if status == "passed":
            continue
        note = ""
        if status.startswith("skipped"):
            kind = skip_kind(status, allow_cpu)
            note = {
                "vllm": " [needs vLLM on CUDA: exit 3]",
                "cuda": " [needs CUDA: exit 3 on a CPU run]",
                "other": " [counts as FAILED: carry what is missing]",
            }[kind]
        lines.append(f"gpu_check:   {name}: {status[:400]}{note}")
    return lines


def exit_status(records: list[dict[str, Any]]) -> int:
    results = {r["result"] for r in records}
    if not records or results & {"failed", "skipped"}:
        return 1
    return SKIP_CODE if "skipped-ok" in results else 0


def main(argv: list[str]) -> int:
    allow_cpu = os.environ.get("GPU_CHECK_ALLOW_CPU") == "1"
    if argv[:1] == ["part"] and len(argv) == 7:
        part, code, cap, seconds, summary, results = argv[1:]
        record = outcome(part, int(code), int(cap), read_summary(Path(summary)), allow_cpu)
        record.update(cap=int(cap), seconds=None if seconds == "-" else int(seconds))  # "-": never started
        print("\n".join(describe(record, allow_cpu)), flush=True)
        with open(results, "a") as out:
            out.write(json.dumps(record) + "\n")
        return 0
    if argv[:1] == ["final"] and len(argv) == 2:
        path = Path(argv[1])
        records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        print("gpu_check: ---- this call's parts ----")
        for record in records:
            print("\n".join(describe(record, allow_cpu)))
        status = exit_status(records)
        meaning = {
            0: "every part passed",
            1: "a part failed, ran past its cap or was skipped for a missing package: not checked",
            3: "nothing failed; what was skipped needs vLLM (or CUDA, on a CPU run)",
        }
        print(f"gpu_check: exit {status}: {meaning[status]}")
        return status
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
