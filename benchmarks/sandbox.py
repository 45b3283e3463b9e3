"""Sandbox throughput and latency, beside a bare ``python -c "print(1)"`` subprocess.

    python benchmarks/sandbox.py [--executions 200] [--concurrency 1 2 8] [--json out.json]

For each concurrency c: a local sandbox with c workers runs ``--executions`` times
``print(1)`` through ``run_many`` (executions per second), and the latency of single ``run``
calls is measured one at a time (p50/p95). The baseline does the same with a cold interpreter
per execution (``subprocess.run([python, "-c", "print(1)"])`` on c threads). A second program,
``import numpy, sympy``, shows what the preloaded modules save. Figures depend on the machine
and its load; the report prints the CPU count and the load average beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from agentrl.config import load_config
from agentrl.tools.sandbox import LocalSandbox, sandbox_environment

PROGRAMS = {"print(1)": "print(1)", "import numpy, sympy": "import numpy, sympy"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cold_run(code: str) -> None:
    command = [sys.executable, "-c", code]
    completed = subprocess.run(command, env=sandbox_environment(), capture_output=True, check=False)
    assert completed.returncode == 0, f"the baseline interpreter failed: {completed.stderr.decode()}"


def measure(run_one, code: str, executions: int, concurrency: int) -> dict[str, float]:
    latencies = []
    for _ in range(max(5, executions // 4)):
        started = time.perf_counter()
        run_one(code)
        latencies.append(time.perf_counter() - started)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(lambda _: run_one(code), range(executions)))
    elapsed = time.perf_counter() - started
    return {
        "executions_per_s": executions / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * percentile(latencies, 0.95),
    }


def bench_sandbox(code: str, executions: int, concurrency: int) -> dict[str, float]:
    cfg = load_config({"sandbox": {"workers": concurrency}}).sandbox
    started = time.perf_counter()
    with LocalSandbox(cfg) as sandbox:
        startup = time.perf_counter() - started

        def run_one(program: str) -> None:
            result = sandbox.run(program)
            assert result.status == "ok", f"the sandbox failed the benchmark program: {result}"

        run_one(code)  # warm
        figures = measure(run_one, code, executions, concurrency)
        figures["startup_s"] = startup
        figures["isolation"] = str(sandbox.isolation)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=200)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 8])
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()}, python: {sys.version.split()[0]}")
    print("| program | backend | concurrency | exec/s | p50 ms | p95 ms | pool start s |")
    print("|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for program_name, code in PROGRAMS.items():
        # A cold numpy + sympy import takes about a second: fewer of those keep the run short.
        executions = args.executions if program_name == "print(1)" else max(10, args.executions // 10)
        for concurrency in args.concurrency:
            for backend in ("sandbox", "cold python"):
                if backend == "sandbox":
                    figures = bench_sandbox(code, executions, concurrency)
                else:
                    figures = measure(cold_run, code, executions, concurrency)
                rows.append({"program": program_name, "backend": backend, "concurrency": concurrency, **figures})
                print(
                    f"| {program_name} | {backend} | {concurrency} | {figures['executions_per_s']:.1f} "
                    f"| {figures['p50_ms']:.1f} | {figures['p95_ms']:.1f} | {figures.get('startup_s', 0):.2f} |",
                    flush=True,
                )
    print(f"isolation: {rows[0]['isolation']}; load average after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"cpus": os.cpu_count(), "load": os.getloadavg(), "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
