"""Shard files: the graded samples of a range of problems, written one problem at a time, resumable.

The scoring of the RL pool and the benchmark evaluation split their problems into ``shards``
contiguous ranges, one Snakemake job each (rules/filter.smk, rules/eval.smk), then gather the
shard files into the stage's usual ``samples.jsonl`` (and pass rates or metrics). Shard ``i`` of
``N`` holds problems ``[P i // N, P (i + 1) // N)`` of the ``P`` in the file's order.

A shard file is JSON lines: a header, then one line per finished problem holding its ``n`` sample
rows, appended and flushed to disk as each problem completes. The job works in
``<shard file>.partial`` and renames it to the shard file when every problem of the range is in
(Snakemake removes a job's declared output before it runs again, never the partial file). A rerun
after a kill keeps the problems already written and rolls out only the rest; a half-written last
line (the kill came mid-write) is dropped. The header's fingerprint says what the samples depend
on (stage and its seed tag, n, the sampling config, the model's digest, the problem file's
digest); a file with another fingerprint is discarded, with a log line naming what differs. The
fingerprint holds neither the shard index nor the count: each problem's rollouts are seeded by
(seed, stage tag, problem id, sample index) alone (:mod:`agentrl.sampling.rollouts`), so a job
also takes the finished problems of its range from the other shard files in its folder, left by
a run with another shard count: changing the count does not roll anything out again.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from agentrl.errors import DataFormatError, StageInterrupted, UserInputError
from agentrl.model.folder import model_digest
from agentrl.sampling.rollouts import PROBLEMS_IN_FLIGHT
from agentrl.stage_cli import at_least
from agentrl.training.fingerprint import file_sha256

if TYPE_CHECKING:
    from agentrl.config import Config
    from agentrl.data.records import Problem
    from agentrl.sampling.rollouts import SamplingSetup

log = logging.getLogger("agentrl.shards")

FORMAT = 1  # header key "agentrl_shard": the version of this layout
PARTIAL_SUFFIX = ".partial"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
ORPHAN_CHECK_S = 1.0  # how often a shard job looks at its parent processes

Rows = list[dict[str, Any]]


def add_shard_arguments(parser: argparse.ArgumentParser, shards_key: str) -> None:
    """The arguments of a resumable shard job (scoring or evaluation): which range, where it goes."""
    parser.add_argument("--shard", type=at_least(0), required=True, help="this shard, 0-based")
    parser.add_argument("--shards", type=at_least(1), required=True, help=f"shards in all ({shards_key})")
    parser.add_argument("--out", type=Path, required=True, help="output: the shard file (jsonl)")
    parser.add_argument(
        "--problems-per-chunk",
        type=at_least(1),
        default=PROBLEMS_IN_FLIGHT,
        help="problems rolled out together (bounds memory)",
    )
    parser.add_argument("--threads", type=at_least(1), help="CPU threads for torch (the rule's threads)")


def shard_range(total: int, shard: int, shards: int) -> tuple[int, int]:
    """``[start, stop)`` of shard ``shard`` (0-based) of ``shards`` over ``total`` problems."""
    if not 0 <= shard < shards:
        raise UserInputError(f"--shard {shard} is not in 0..{shards - 1} (--shards {shards})")
    return total * shard // shards, total * (shard + 1) // shards


def fingerprint(
    stage: str, n: int, sampling: Mapping[str, Any], model_dir: str | Path, problems_path: str | Path
) -> dict[str, Any]:
    """What a shard's samples depend on; ``sampling`` is the config the rollouts read (JSON-able).

    Keys marked ``x-rerun: false`` (workers, engine memory) are left out: changing them between a
    kill and the rerun keeps the finished problems.
    """
    from agentrl.config_schema import rerun_keys

    blob = json.dumps(rerun_keys(json.loads(json.dumps(sampling))), sort_keys=True, separators=(",", ":"))
    return {
        "stage": stage,
        "n": n,
        "sampling": hashlib.sha256(blob.encode()).hexdigest(),
        "model": model_digest(model_dir),  # computed: a stamp copied by save_pretrained can be stale
        "problems": file_sha256(problems_path),
    }


def _differences(found: Mapping[str, Any], expected: Mapping[str, Any]) -> str:
    keys = sorted(set(found) | set(expected))
    return ", ".join(
        f"{key} {found.get(key)!r} (now {expected.get(key)!r})" for key in keys if found.get(key) != expected.get(key)
    )


def _lines(fh: BinaryIO) -> Iterator[tuple[int, bytes, bool]]:
    """(offset, line, complete) of each line; the last one is incomplete without its newline."""
    offset = 0
    for line in fh:
        yield offset, line, line.endswith(b"\n")
        offset += len(line)


def index_shard_file(path: Path, expected: Mapping[str, Any] | None, *, finished: bool) -> dict[str, int] | None:
    """Problem id -> byte offset of its line, or None for a file of another fingerprint (logged).

    ``finished``: a shard file the job completed, where a broken line is an error; in a partial
    file a broken last line is the write a kill interrupted, and is dropped (logged).
    """
    offsets: dict[str, int] = {}
    with open(path, "rb") as fh:
        lines = _lines(fh)
        first = next(lines, None)
        header = _parse(first[1], path, 1) if first and first[2] else None
        if not isinstance(header, dict) or header.get("agentrl_shard") != FORMAT:
            log.warning("discarding %s: no shard header (not a shard file, or cut before its first line)", path)
            return None
        if expected is not None and header["fingerprint"] != dict(expected):
            log.warning(
                "discarding %s: written for another config: %s", path, _differences(header["fingerprint"], expected)
            )
            return None
        for number, (offset, line, complete) in enumerate(lines, 2):
            if not complete:
                if finished:
                    raise DataFormatError(f"{path} line {number}: cut short in a finished shard file")
                log.info("%s: dropping the half-written line %d (the job was killed while writing it)", path, number)
                break
            problem_id = _parse(line, path, number)["problem_id"]
            if problem_id in offsets:
                raise DataFormatError(f"{path} line {number}: problem {problem_id!r} is written twice")
            offsets[problem_id] = offset
    return offsets


def _parse(line: bytes, path: Path, number: int) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path} line {number}: not valid JSON: {exc}") from None


def read_rows(path: Path, offset: int) -> Rows:
    """The sample rows of the problem whose line starts at ``offset``."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return json.loads(fh.readline())["rows"]


def read_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        header = _parse(fh.readline(), path, 1)
    if not isinstance(header, dict) or header.get("agentrl_shard") != FORMAT:
        raise DataFormatError(f"{path}: not a shard file (no shard header on line 1)")
    return header


Lines = list[tuple[Path, int]]  # where finished problems' lines are: (file, byte offset)


class ShardWriter:
    """Appends one line per finished problem to a partial shard file, each flushed to disk."""

    def __init__(self, path: Path, header: Mapping[str, Any], carried: Lines) -> None:
        """Start ``path`` anew with ``header`` and the ``carried`` lines (copied from earlier files).

        Written beside and moved over the old file, so a kill meanwhile leaves the old one intact.
        """
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as out:
            out.write(_line(header))
            for source, offset in carried:
                with open(source, "rb") as fh:
                    fh.seek(offset)
                    out.write(fh.readline())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        self._fh = open(path, "ab")

    def add(self, problem_id: str, rows: Rows) -> None:
        self._fh.write(_line({"problem_id": problem_id, "rows": rows}))
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


def _line(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")


def finished_lines(
    partial: Path, folder: Path, expected: Mapping[str, Any], wanted: Sequence[str]
) -> dict[str, tuple[Path, int]]:
    """Where the problems of ``wanted`` already finished are: in the job's own partial file, then in
    the other shard files of ``folder`` with the same fingerprint (another shard count's)."""
    found: dict[str, tuple[Path, int]] = {}
    wanted_set = set(wanted)
    candidates = [partial] if partial.exists() else []
    candidates += sorted(p for p in folder.glob("*-of-*.jsonl") if p != partial)  # the workflow's shard names
    candidates += sorted(p for p in folder.glob(f"*-of-*.jsonl{PARTIAL_SUFFIX}") if p != partial)
    for path in candidates:
        missing = wanted_set - set(found)
        if not missing:
            break
        index = index_shard_file(path, expected, finished=False) or {}
        reused = sorted(set(index) & missing)
        found.update((problem_id, (path, index[problem_id])) for problem_id in reused)
        if reused:
            log.info("%s: %d finished problems of this shard taken over", path, len(reused))
    return found


def run_shard(
    cfg: Config,
    model_dir: Path,
    problems_path: Path,
    setup: SamplingSetup,
    sampling: Mapping[str, Any],
    shard: int,
    shards: int,
    out: Path,
) -> None:
    """Roll out and grade shard ``shard`` of ``shards`` of the problems into the shard file ``out``.

    ``sampling``: the config sections the rollouts read (the fingerprint's). Resumes from
    ``out.partial`` and takes finished problems over from the other shard files beside ``out``.
    """
    from agentrl.rewards.ground_truth import read_gradable_problems
    from agentrl.training.folder_lock import hold_shard_file

    problems = read_gradable_problems(problems_path)
    start, stop = shard_range(len(problems), shard, shards)
    expected = fingerprint(setup.seed_tag, setup.n, sampling, model_dir, problems_path)
    with hold_shard_file(out, setup.seed_tag), stop_on_signal_or_orphaning():
        if _finished_already(out, expected, [p.id for p in problems[start:stop]]):
            log.info("%s: already finished by an earlier job with this config; kept as it is", out)
            return
        _write_shard(cfg, model_dir, problems, setup, expected, (shard, shards, start, stop), out)


def _finished_already(out: Path, expected: Mapping[str, Any], wanted: Sequence[str]) -> bool:
    """Whether ``out`` is a finished shard file of this fingerprint holding exactly ``wanted``: an
    orphan that got its last problem in before it stopped. Never written over."""
    if not out.is_file():
        return False
    try:
        index = index_shard_file(out, expected, finished=True)
    except DataFormatError:
        return False
    return index is not None and set(index) == set(wanted)


def _write_shard(
    cfg: Config,
    model_dir: Path,
    problems: Sequence[Problem],
    setup: SamplingSetup,
    expected: Mapping[str, Any],
    where: tuple[int, int, int, int],
    out: Path,
) -> None:
    from agentrl.sampling.rollouts import grade_problems

    shard, shards, start, stop = where
    mine = problems[start:stop]
    header = {
        "agentrl_shard": FORMAT,
        "fingerprint": expected,
        "shard": shard,
        "shards": shards,
        "range": [start, stop],
    }
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    done = finished_lines(partial, out.parent, expected, [p.id for p in mine])
    todo = [p for p in mine if p.id not in done]
    log.info(
        "shard %d of %d: problems %d-%d of %d, %d already finished, %d to roll out",
        shard + 1,
        shards,
        start + 1,
        stop,
        len(problems),
        len(done),
        len(todo),
    )
    writer = ShardWriter(partial, header, [done[p.id] for p in mine if p.id in done])
    try:
        if todo:
            grade_problems(cfg, str(model_dir), todo, setup, lambda problem, rows: writer.add(problem.id, rows))
    finally:
        writer.close()
    os.replace(partial, out)


class ShardStopped(StageInterrupted):
    """A shard job stopped by SIGTERM, SIGUSR1 or its parent's exit; its finished problems are kept."""

    exit_code = 75  # EX_TEMPFAIL, as a stopped trainer: the retry takes the finished problems over


@contextlib.contextmanager
def stop_on_signal_or_orphaning() -> Iterator[None]:
    """Raise :class:`ShardStopped` in the job on SIGTERM or SIGUSR1, and within seconds of a parent
    process's exit (``kill -9`` of Snakemake: nobody would collect the shard, and the rerun's job
    waits for this one's lock). Every finished problem is on disk already, so stopping mid-chunk
    loses only the problems in flight. Outside the main thread nothing is installed."""
    from agentrl.training.parent_watch import watch_ancestors

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, _frame: Any) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)  # a second signal kills at once
        raise ShardStopped(
            f"stopped by {signal.Signals(signum).name}: the finished problems are kept in the partial shard "
            "file and running the same command again rolls out only the rest (exit code 75)"
        )

    def on_parent_exit(gone: Any) -> None:
        log.warning("parent process %d (%s) exited: stopping this shard job", gone.pid, gone.name)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        with watch_ancestors(on_parent_exit, ORPHAN_CHECK_S):
            yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def gathered_rows(problems: Sequence[Problem], shard_paths: Sequence[Path], n: int) -> Iterator[dict[str, Any]]:
    """The sample rows of every problem, in problem order, from finished shard files of one fingerprint.

    Streams (one problem's rows in memory at a time); refuses shard files of different
    fingerprints, a problem missing or written twice, and a problem without ``n`` rows.
    """
    where: dict[str, tuple[Path, int]] = {}
    first: tuple[Path, dict] | None = None
    for path in shard_paths:
        header = read_header(path)
        if first is None:
            first = (path, header["fingerprint"])
        elif header["fingerprint"] != first[1]:
            raise DataFormatError(
                f"{path} and {first[0]} come from different runs: {_differences(header['fingerprint'], first[1])}"
            )
        for problem_id, offset in (index_shard_file(path, None, finished=True) or {}).items():
            if problem_id in where:
                raise DataFormatError(f"problem {problem_id!r} is in both {where[problem_id][0]} and {path}")
            where[problem_id] = (path, offset)
    missing = [p.id for p in problems if p.id not in where]
    if missing:
        raise DataFormatError(
            f"{len(missing)} problems are in no shard file of {[str(p) for p in shard_paths]}: {missing[:5]}"
        )
    extra = set(where) - {p.id for p in problems}
    if extra:
        raise DataFormatError(f"the shard files hold problems that are not in the problem file: {sorted(extra)[:5]}")
    for problem in problems:
        rows = read_rows(*where[problem.id])
        if len(rows) != n:
            raise DataFormatError(
                f"{where[problem.id][0]}: problem {problem.id!r} has {len(rows)} samples, expected {n}"
            )
        yield from rows
