"""Scoring shards of a problem pool in-process with the filter stage's CLI, and gathering them."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.data.records import Problem, write_records
from agentrl.filtering import cli as filter_cli

# Small budgets (an untrained model rambles to the budget); two turns so problems end apart.
SHARD_CONFIG = {
    "seed": 5,
    "rollout": {"max_response_tokens": 24, "max_turns": 2, "batch_size": 8},
    "reward": {"overlong": {"max_response_length": 24, "buffer_length": 8}},
    "sandbox": {"workers": 1, "preload_modules": []},
    "filter": {"k": 3},
    "eval": {"n": 3},
}


def shard_problems(count: int) -> list[Problem]:
    """``count`` arithmetic problems of three levels whose prompts differ in length."""
    return [
        Problem(
            f"p{i:02d}",
            "embedded-arith",
            [{"role": "user", "content": f"Compute {i} + {i % 7}." + " Show it." * (i % 3)}],
            "math",
            str(i + i % 7),
            {"family": "arith", "level": 1 + i % 3},
        )
        for i in range(count)
    ]


def score_shard(
    model_dir: Path, pool: Path, out: Path, shard: int, shards: int, config=SHARD_CONFIG, chunk=256
) -> None:
    """``filter score-shard`` of shard ``shard`` of ``shards`` of ``pool`` into ``out``, in this process."""
    args = ["score-shard", "--config-json", json.dumps(config), "--model", str(model_dir), "--pool", str(pool)]
    args += ["--shard", str(shard), "--shards", str(shards), "--out", str(out), "--threads", "1"]
    assert filter_cli.main([*args, "--problems-per-chunk", str(chunk)]) == 0


def gather_shards(pool: Path, shard_files: list[Path], out: Path) -> tuple[bytes, bytes]:
    """``filter gather`` of ``shard_files`` into ``out``: the bytes of its pass rates and samples."""
    args = ["gather", "--config-json", json.dumps(SHARD_CONFIG), "--pool", str(pool), "--shard-files"]
    args += [*map(str, shard_files), "--out", str(out / "pass_rates.parquet"), "--samples", str(out / "samples.jsonl")]
    assert filter_cli.main(args) == 0
    return (out / "pass_rates.parquet").read_bytes(), (out / "samples.jsonl").read_bytes()


def scored_in_one_job(model_dir: Path, root: Path) -> tuple[Path, Path, tuple[bytes, bytes]]:
    """9 problems in ``root`` scored as one shard: (pool path, the shard file, gathered pass rates and samples)."""
    write_records(shard_problems(9), root / "pool.parquet")
    score_shard(model_dir, root / "pool.parquet", root / "shards/0-of-1.jsonl", 0, 1)
    return (
        root / "pool.parquet",
        root / "shards/0-of-1.jsonl",
        gather_shards(root / "pool.parquet", [root / "shards/0-of-1.jsonl"], root),
    )


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet collected, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def finished_problems(partial: Path) -> int:
    """Problems whose line is complete in a (partial) shard file, the header aside."""
    return sum(1 for line in partial.read_bytes().splitlines()[1:] if line.endswith(b"}"))


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, their children, ...), read from /proc."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
