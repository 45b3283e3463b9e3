"""Run untrusted Python code (the model's tool calls, code-reward tests) and get its result.

Recipe: upstream sends every ``code_interpreter`` call and every code test case to a
SandboxFusion service (``POST /run_code``, 30 s, 2048 MB per run; docs/recipe.md section 3). This
module is the in-process replacement the embedded pipeline needs (no service, no network), and
:mod:`agentrl.tools.sandbox_fusion` keeps the service as a second backend behind the same
interface (``sandbox.backend``).

Design (departure from upstream, for throughput): a pool of ``sandbox.workers`` pre-started
worker processes; each forks a fresh child per execution from an interpreter that has the
standard modules and ``sandbox.preload_modules`` (numpy, sympy) imported already, instead of
starting a cold interpreter each time, and forks it ahead of the request (see
:mod:`agentrl.tools.sandbox_worker`; figures from ``benchmarks/sandbox.py``: about 10x the
throughput of a cold ``python -c``, and ~100x for code that imports numpy and sympy). ``run``
may be called from many threads; ``run_many`` runs a batch concurrently on the pool. A worker
that dies is replaced; a result always comes back.

What one execution is protected against, where Linux allows it (``Sandbox.isolation`` reports
what this host granted; each item has a test in tests/test_sandbox.py that tries to break it):

* **Runaway time**: wall-clock timeout (``timeout_s``) and CPU-time limit (``cpu_time_s``).
* **Memory**: address-space limit (``memory_mb``, on top of the warm interpreter's own mapping):
  a memory bomb gets ``MemoryError``.
* **Fork bombs**: a process limit (``max_processes``, threads included) enforced by the kernel
  because the code runs under its own unprivileged uid (61000-64999, one per worker) when the
  worker is root, or inside a user namespace otherwise.
* **Output floods**: stdout and stderr are read continuously (the code never blocks on a full
  pipe) and kept up to ``max_output_bytes`` each; the result says ``truncated``.
* **Leftover processes**: every process the code started, daemonized or not, is killed when
  the main one exits or times out (the worker is PID 1 of its own PID namespace and kills the
  whole namespace; without one, by uid or by walking its descendants).
* **Network**: a new network namespace with only a loopback interface; nothing outside is
  reachable. ``network_isolation: required`` refuses to start without it, ``best_effort`` runs
  and logs once that it is unavailable.
* **Secrets in the environment**: the worker and the code get a fixed minimal environment
  (PATH, LANG, HOME=workdir, thread caps for BLAS); no variable of the caller is visible, and the
  caller's ``/proc/<pid>/environ`` is out of reach (another PID namespace, another uid).
* **Files**: the code's root is a private one (a mount namespace and ``pivot_root``) that holds
  only, read-only, the system programs and libraries (``/usr``, ``/bin``, ``/lib*``, the
  dynamic loader's files of ``/etc``, ``/etc/localtime``), the Python installation and its
  packages (every directory of ``sys.prefix`` and ``sys.path``, wherever they live: under
  ``/root``, ``/home`` or ``/tmp`` too), a minimal ``/dev`` (null, zero, full, random, urandom),
  its own ``/proc``, and private, size-limited ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (tmpfs,
  new for each execution). Nothing else of the host exists there: not the repository (an
  editable install of this package is left out), its data and results folders, other users'
  files or home directories, ``/etc``'s other files, ``/sys``. The code starts in a fresh empty
  working directory (``/tmp/run``, the same path each time, so tracebacks are reproducible; a
  random one without namespaces); ``max_file_mb`` caps any single file. It has no capability:
  nothing bypasses file permissions (if the sandbox uid cannot read the Python installation,
  the sandbox refuses to start and names the path).
* **The caller**: the code runs in its own session and process group, in another PID namespace
  and (as root) another uid, with no capabilities and ``no_new_privs``; ``os.kill(os.getppid())``,
  ``os.killpg`` and ``kill -9 -1`` reach only the code's own processes.

What it does not protect against:

* Reading the system directories and the Python installation listed above (world-readable
  files there, e.g. under ``/usr``), and information in ``/proc`` about the machine (CPUs,
  memory, kernel version).
* Kernel exploits and side channels: this is process isolation on a shared kernel, not a VM.
  Run the RL job itself in a container or VM if the policy might be adversarial.
* Aggregate memory: each process has its own address-space limit, so a program may use up to
  ``max_processes x memory_mb`` (no cgroup is used).
* CPU contention with other jobs; a tool call can slow the host, not stop it.
* Degraded hosts: without namespaces (e.g. a container without CAP_SYS_ADMIN) there is no
  network, mount or PID isolation: the code can read every world-readable file of the host, write
  where the sandbox uid may (world-writable directories such as ``/tmp``), and detached
  processes are found by uid or process tree instead. If, there, the sandbox uid cannot read the
  Python installation (e.g. pyenv under a ``0700`` ``/root``), the code keeps
  CAP_DAC_READ_SEARCH and can read every file (``Isolation.read_override``, logged); with
  namespaces this never happens. An unprivileged user without user namespaces gets no uid
  switch: the code can signal the caller's other processes. ``LocalSandbox.isolation`` and the
  log say which case applies.
* Information left in the worker's memory by earlier executions is readable by later ones
  (each child is a copy of the worker); only code and stdin ever reach the worker.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import logging
import os
import queue
import random
import select
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config import SandboxConfig
from agentrl.tools.sandbox_worker import FRAME_HEADER

logger = logging.getLogger(__name__)

STATUSES = ("ok", "error", "timeout", "killed")
# What a tool call came to, in one vocabulary for every stage (agentrl.tools.health): the first
# four are the program's doing (``parse_failure`` is the model's malformed call, classified by
# the agent loop), ``infra_failure`` is the sandbox's (it lost the execution, a worker died, the
# service did not answer, the call waited for a worker past ``sandbox.max_queue_wait_s``).
OUTCOMES = ("ok", "parse_failure", "program_error", "program_timeout", "infra_failure")
# Signals that mean the program's own time ran out: the CPU limit's soft (SIGXCPU) and hard
# (SIGKILL) signal, the wall-clock kill.
_TIME_LIMIT_SIGNALS = (-signal.SIGXCPU, -signal.SIGKILL)
_READY_TIMEOUT_S = 120.0
# Time the worker may need beyond the code's own timeout: fork, kill, drain, reap, reset tmp.
_ANSWER_GRACE_S = 15.0
_STOP_GRACE_S = 1.0
_SANDBOX_UIDS = range(61000, 65000)
_BOOTSTRAP = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from agentrl.tools.sandbox_worker import main; del sys.path[0]; sys.exit(main(sys.argv[2]))"
)
# Far above any real answer (two capped streams, JSON-escaped): a bound on a garbled header.
_MAX_ANSWER_BYTES = 1 << 28


class SandboxUnavailableError(RuntimeError):
    """The sandbox cannot run as configured (e.g. network isolation required but not available)."""


@dataclass(frozen=True)
class ExecutionResult:
    """What one execution did.

    ``status``: ``ok`` (exit status 0), ``error`` (non-zero exit, e.g. an uncaught exception),
    ``timeout`` (wall-clock limit reached), ``killed`` (ended by a signal, e.g. the CPU limit; or
    lost by the sandbox itself, then ``exit_code`` is None and ``stderr`` says why).
    ``exit_code``: the process's exit status, negative for a signal (``-9``: SIGKILL).
    ``truncated``: stdout or stderr was longer than ``max_output_bytes`` and was cut.
    ``infra_failure``: the sandbox, not the program, failed the execution (see :attr:`outcome`).
    ``queue_s``: seconds the request waited for a free worker (or request slot) before it was
    sent; ``duration_s`` is the run itself (the worker's clock, or the service's).
    """

    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    duration_s: float
    truncated: bool
    infra_failure: bool = False
    queue_s: float = 0.0

    def __post_init__(self) -> None:
        assert self.status in STATUSES, f"ExecutionResult.status must be one of {STATUSES}, got {self.status!r}"

    @property
    def outcome(self) -> str:
        """``ok``, ``program_error`` (non-zero exit, an exception, a signal of its own),
        ``program_timeout`` (wall clock or CPU time ran out while it ran) or ``infra_failure``."""
        if self.infra_failure:
            return "infra_failure"
        if self.status == "ok":
            return "ok"
        if self.status == "timeout" or (self.status == "killed" and self.exit_code in _TIME_LIMIT_SIGNALS):
            return "program_timeout"
        return "program_error"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExecutionResult:
        """From :meth:`to_json`'s dict, or a worker's answer (which has no bookkeeping fields)."""
        fields = dataclasses.fields(cls)
        missing = [f.name for f in fields if f.name not in data and f.default is dataclasses.MISSING]
        if missing:
            raise KeyError(f"execution result without {missing}: {str(data)[:200]}")
        return cls(**{f.name: data[f.name] for f in fields if f.name in data})


def lost_result(reason: str, duration_s: float = 0.0, status: str = "killed") -> ExecutionResult:
    """The result of an execution the sandbox itself failed (no exit status to report): an
    infrastructure failure, whatever ``status`` the caller's old contract reports."""
    return ExecutionResult(status, "", reason, None, duration_s, False, infra_failure=True)


@dataclass(frozen=True)
class Isolation:
    """What isolation this host granted the local sandbox (see the module docstring).

    ``network``: own network namespace (loopback only). ``pid_namespace``: the worker is PID 1 of
    its own PID namespace. ``mount_namespace``, ``private_root`` (the code's root shows only the
    system directories, the Python installation and its working directory), ``readonly_root``,
    ``private_tmp``: the filesystem protections. ``user_switch``: the code runs as a sandbox uid
    (the process limit is enforced). ``read_override``: that uid keeps CAP_DAC_READ_SEARCH (only
    without a private root, when the uid could not otherwise read the Python installation).
    ``user_namespace``: the namespaces were created unprivileged, through a user namespace.
    """

    network: bool
    pid_namespace: bool
    mount_namespace: bool
    private_tmp: bool
    readonly_root: bool
    private_root: bool
    user_switch: bool
    read_override: bool
    user_namespace: bool


class Sandbox(abc.ABC):
    """Runs Python code; ``run`` is thread-safe, ``run_many`` runs a batch concurrently."""

    def __init__(self, concurrency: int, max_queue_wait_s: float | None = None):
        assert concurrency >= 1, f"sandbox concurrency must be >= 1, got {concurrency}"
        self.concurrency = concurrency
        self.max_queue_wait_s = max_queue_wait_s
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="sandbox")
        self._closed = False

    @abc.abstractmethod
    def run(
        self, code: str, stdin: str | None = None, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> ExecutionResult:
        """Run ``code`` with ``stdin``; ``timeout_s`` and ``memory_mb`` default to the ``sandbox`` section's."""

    def submit(self, code: str, stdin: str | None = None, timeout_s: float | None = None) -> Future[ExecutionResult]:
        """Run ``code`` in the sandbox's own pool (at most ``concurrency`` at once); returns its future."""
        self._check_open()
        return self._executor.submit(self._run_queued, time.monotonic(), code, stdin, timeout_s)

    def run_many(
        self, jobs: Sequence[tuple[str, str | None]], timeout_s: float | None = None, memory_mb: int | None = None
    ) -> list[ExecutionResult]:
        """Run ``(code, stdin)`` jobs concurrently; results in input order."""
        jobs = list(jobs)
        for index, job in enumerate(jobs):
            if not (isinstance(job, (tuple, list)) and len(job) == 2):
                raise TypeError(f"run_many: job {index} must be a (code, stdin) pair, got {type(job).__name__}")
        self._check_open()
        queued = time.monotonic()
        return list(
            self._executor.map(lambda job: self._run_queued(queued, job[0], job[1], timeout_s, memory_mb), jobs)
        )

    def _run_queued(
        self, queued: float, code: str, stdin: str | None, timeout_s: float | None, memory_mb: int | None = None
    ) -> ExecutionResult:
        """``run`` for a request queued in the pool at ``queued``: its wait is added to
        ``queue_s``, and a wait past ``max_queue_wait_s`` is an infrastructure failure (the
        program never started: an overloaded pool is not the program's doing)."""
        waited = time.monotonic() - queued
        if self.max_queue_wait_s is not None and waited > self.max_queue_wait_s:
            reason = f"sandbox error: waited {waited:.1f} s for a worker, over sandbox.max_queue_wait_s"
            return dataclasses.replace(lost_result(reason), queue_s=waited)
        limits = {} if memory_mb is None else {"memory_mb": memory_mb}
        result = self.run(code, stdin, timeout_s, **limits)
        return dataclasses.replace(result, queue_s=result.queue_s + waited)

    def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")

    @staticmethod
    def _check_request(code: object, stdin: object, timeout_s: float | None, default_timeout_s: float) -> float:
        if not isinstance(code, str):
            raise TypeError(f"sandbox code must be a str, got {type(code).__name__}")
        if stdin is not None and not isinstance(stdin, str):
            raise TypeError(f"sandbox stdin must be a str or None, got {type(stdin).__name__}")
        timeout = default_timeout_s if timeout_s is None else float(timeout_s)
        if not timeout > 0:
            raise ValueError(f"sandbox timeout_s must be > 0, got {timeout_s!r}")
        return timeout


def sandbox_environment() -> dict[str, str]:
    """The whole environment of the worker and the code: nothing from the caller's."""
    bin_dir = os.path.dirname(sys.executable)
    return {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TMPDIR": "/tmp",
        # One BLAS thread: threads count against max_processes, and runs are parallel already
        # (upstream's tool wrapper sets OPENBLAS_NUM_THREADS=1 for the same reason).
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


class _WorkerLost(Exception):
    def __init__(self, reason: str, deadline_passed: bool = False):
        super().__init__(reason)
        self.deadline_passed = deadline_passed


class _WorkerProcess:
    """One worker (see sandbox_worker); used by one thread at a time."""

    def __init__(self, launch: dict[str, Any]):
        package_root = str(Path(__file__).resolve().parents[2])
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", _BOOTSTRAP, package_root, json.dumps(launch)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=sandbox_environment(),
            cwd="/",
            start_new_session=True,  # a Ctrl-C aimed at the caller's process group does not hit it
        )
        self.ready: dict[str, Any] = {}

    def wait_ready(self) -> dict[str, Any]:
        message = self.receive(time.monotonic() + _READY_TIMEOUT_S)
        if not message.get("ready"):
            raise _WorkerLost(f"unexpected first message from the sandbox worker: {message!r}")
        self.ready = message
        return message

    def send(self, message: dict[str, Any]) -> None:
        payload = json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass")
        data = memoryview(FRAME_HEADER.pack(len(payload)) + payload)
        fd = self.process.stdin.fileno()
        while data:
            data = data[os.write(fd, data) :]

    def receive(self, deadline: float) -> dict[str, Any]:
        header = self._read_exact(FRAME_HEADER.size, deadline)
        size = FRAME_HEADER.unpack(header)[0]
        if size > _MAX_ANSWER_BYTES:
            raise _WorkerLost(f"the sandbox worker announced an answer of {size} bytes")
        payload = self._read_exact(size, deadline)
        return json.loads(payload.decode("utf-8", "surrogatepass"))

    def _read_exact(self, size: int, deadline: float) -> bytes:
        chunks, remaining = [], size
        while remaining:
            wait = deadline - time.monotonic()
            try:
                fd = self.process.stdout.fileno()
                ready = wait > 0 and select.select([fd], [], [], wait)[0]
                chunk = os.read(fd, remaining) if ready else None
            except (OSError, ValueError) as exc:  # the pipe was closed under us (the sandbox is closing)
                raise _WorkerLost(f"the connection to the sandbox worker broke: {exc}") from None
            if chunk is None:
                raise _WorkerLost("the sandbox worker did not answer in time", deadline_passed=True)
            if not chunk:
                code = self.process.poll()
                raise _WorkerLost(f"the sandbox worker exited unexpectedly (exit status {code})")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def alive(self) -> bool:
        return self.process.poll() is None

    def close_pipes(self) -> None:
        """An idle worker ends when its input closes (and with it its PID namespace)."""
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def stop(self, deadline: float) -> None:
        self.close_pipes()
        try:
            self.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # busy with a job, or stuck: the kernel ends the namespace
            self.process.kill()
            self.process.wait()


def _stop_workers(workers: list[_WorkerProcess | None]) -> None:
    live = [worker for worker in workers if worker is not None]
    for worker in live:
        worker.close_pipes()
    deadline = time.monotonic() + _STOP_GRACE_S
    for worker in live:
        worker.stop(deadline)


class LocalSandbox(Sandbox):
    """The local backend: a pool of forking worker processes on this machine.

    ``sandbox.preload_modules`` are imported by each worker before it forks (fewer start
    faster). ``namespaces=False`` skips the Linux namespaces (network, PID, mount) even where
    the host allows them: for hosts where creating them is known to misbehave, and to test the
    degraded mode. The rest of the protection (limits, uid, process cleanup) still applies.
    ``isolation`` says what the host granted.
    """

    def __init__(self, cfg: SandboxConfig, *, namespaces: bool = True):
        super().__init__(cfg.workers, cfg.max_queue_wait_s)
        self.config = cfg
        self._namespaces = namespaces
        self._idle: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._workers: list[_WorkerProcess | None] = [self._launch() for _ in range(cfg.workers)]
        self._finalizer = weakref.finalize(self, _stop_workers, self._workers)
        try:
            for worker in self._workers:
                worker.wait_ready()
            first = self._workers[0].ready
            self.isolation = Isolation(**first["isolation"])
            self._check_isolation(first)
        except _WorkerLost as exc:
            self.close()
            raise SandboxUnavailableError(f"the sandbox workers did not start: {exc} (their stderr says why)") from None
        except BaseException:
            self.close()
            raise
        for slot in range(cfg.workers):
            self._idle.put(slot)

    def _launch(self) -> _WorkerProcess:
        cfg = self.config
        return _WorkerProcess(
            {
                "namespaces": self._namespaces,
                "uid": random.choice(_SANDBOX_UIDS),
                "limits": {
                    "cpu_time_s": cfg.cpu_time_s,
                    "memory_mb": cfg.memory_mb,
                    "max_processes": cfg.max_processes,
                    "max_file_mb": cfg.max_file_mb,
                    "max_output_bytes": cfg.max_output_bytes,
                },
                "tmpfs_mb": max(64, 4 * cfg.max_file_mb),
                "preload": list(cfg.preload_modules),
                "env": sandbox_environment(),
            }
        )

    def _check_isolation(self, ready: dict[str, Any]) -> None:
        notes = "; ".join(ready["notes"]) or "no details"
        if not self.isolation.network:
            if self.config.network_isolation == "required":
                raise SandboxUnavailableError(
                    "sandbox.network_isolation is 'required' but this host does not allow a network "
                    f"namespace ({notes}); set it to 'best_effort' to run without network isolation"
                )
            logger.warning(
                "sandbox: network isolation is unavailable on this host, code can reach the network (%s)", notes
            )
        elif ready["notes"]:
            logger.info("sandbox: partial isolation: %s", notes)
        if ready["not_importable"]:
            logger.warning("sandbox: preload modules not importable in the sandbox: %s", ready["not_importable"])
        logger.debug("sandbox: %d workers, isolation %s", self.concurrency, self.isolation)

    def worker_pids(self) -> list[int]:
        """Process ids of the live worker processes (the outer process of each)."""
        return [w.process.pid for w in self._workers if w is not None and w.alive()]

    def run(
        self, code: str, stdin: str | None = None, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> ExecutionResult:
        timeout = self._check_request(code, stdin, timeout_s, self.config.timeout_s)
        if memory_mb is not None and memory_mb > self.config.memory_mb:
            # the workers' children are forked with sandbox.memory_mb as their hard limit
            raise ValueError(
                f"a run's memory_mb ({memory_mb}) cannot exceed sandbox.memory_mb ({self.config.memory_mb})"
            )
        self._check_open()
        waiting = time.monotonic()
        slot = self._idle.get()
        waited = time.monotonic() - waiting
        request = {"code": code, "stdin": stdin, "timeout_s": timeout, "memory_mb": memory_mb}
        try:
            result = self._run_on(slot, request, timeout)
        finally:
            self._idle.put(slot)
        return dataclasses.replace(result, queue_s=waited)

    def _run_on(self, slot: int, request: dict[str, Any], timeout: float) -> ExecutionResult:
        for _ in range(2):  # a worker found dead before it took the job gets one replacement
            try:
                worker = self._live_worker(slot)
            except (_WorkerLost, OSError) as exc:
                logger.error("sandbox: could not start a worker: %s", exc)
                return lost_result(f"sandbox error: could not start a worker: {exc}")
            started = time.monotonic()
            try:
                worker.send(request)
            except (OSError, ValueError):  # died while idle, or its pipe is closed
                self._discard(slot)
                continue
            try:
                return ExecutionResult.from_json(worker.receive(started + timeout + _ANSWER_GRACE_S))
            except _WorkerLost as exc:
                self._discard(slot)
                status = "timeout" if exc.deadline_passed else "killed"
                return lost_result(f"sandbox error: {exc}", time.monotonic() - started, status)
            except (ValueError, KeyError, TypeError, AssertionError) as exc:  # a garbled answer
                self._discard(slot)
                reason = f"sandbox error: malformed answer from the worker: {exc!r}"
                return lost_result(reason, time.monotonic() - started)
        return lost_result("sandbox error: the worker died twice before it could take the job")

    def _live_worker(self, slot: int) -> _WorkerProcess:
        worker = self._workers[slot]
        if worker is not None and worker.alive():
            return worker
        self._discard(slot)
        self._check_open()
        worker = self._launch()
        self._workers[slot] = worker
        worker.wait_ready()
        if not worker.ready["isolation"]["network"] and self.config.network_isolation == "required":
            raise _WorkerLost("a restarted worker has no network isolation, which is required")
        return worker

    def _discard(self, slot: int) -> None:
        worker, self._workers[slot] = self._workers[slot], None
        if worker is not None:
            worker.process.kill()
            worker.stop(time.monotonic())

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        self._finalizer()
