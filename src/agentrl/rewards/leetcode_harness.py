"""The program of one LeetCode-style test: the row's check with one assert, against a solution it never runs.

:class:`agentrl.rewards.code_verifier.CheckHarness` sends this file's source, followed by the line
``run()``, as ``main.py`` of a sandbox run, and the case as JSON on its stdin (the row's
``import_prefix``, the solution, the check definition with one assert, the ``entry_point``), so
the test is never in a file the solution could read. Standard library only: it runs inside the
sandbox, where the agentrl package is not visible.

Why two processes. If the solution and the assert share a process, the solution decides what
"the test ran to its end" means: ``os._exit(0)``, ``sys.exit(0)``, an ``atexit`` hook, a
redefined ``check`` or ``AssertionError``, patched builtins, a trace function that jumps over
the assert, a return value whose ``__eq__`` is always true. Here the process that runs this file
(the *checker*) executes only the row's code (import prefix, check, assert). It forks a
*solution* process that executes ``import_prefix + solution`` and serves calls of the entry
point over a pipe; the checker's ``candidate`` sends the arguments and gets back the return value
(and the arguments as the call left them, for in-place problems) as data: a restricted
unpickler admits only plain Python values, a few standard containers and the classes the import
prefix defines (``ListNode``, ``TreeNode``), never an object of a class of the solution's own.
The checker then runs the assert itself and prints :data:`PASSED` on its stdout. The solution
process holds no descriptor of that stdout (its 0 and 1 are ``/dev/null``), was forked before
the checker read the test (so the assert and its expected value were never in its memory), and
the checker is not dumpable, so ``/proc/<checker>/fd``, ``/proc/<checker>/mem`` and ptrace are
closed to a process of the same uid. What the solution does to its own process changes only the values it
returns; if it dies or hangs, the call fails or the run times out.
"""

from __future__ import annotations

import collections
import ctypes
import io
import json
import os
import pickle
import struct
import sys
import threading
import traceback
import types

PASSED = "@@agentrl-check-passed@@"
_MODULE = "solution"  # the module name of the prefix's classes on both sides of the pipe
_LENGTH = struct.Struct(">Q")
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _SIGKILL = 1, 4, 9
_DEEP_STACK_BYTES = 64 << 20  # for (un)pickling long linked lists and deep trees
_PLAIN_GLOBALS = {
    ("builtins", name)
    for name in (
        "bool",
        "bytearray",
        "bytes",
        "complex",
        "dict",
        "float",
        "frozenset",
        "int",
        "list",
        "range",
        "set",
        "slice",
        "str",
        "tuple",
    )
} | {("collections", name) for name in ("Counter", "OrderedDict", "deque")}


class SolutionError(Exception):
    """The solution raised, died or returned something that is not data."""


# --------------------------------------------------------------------------- framing
def _send(fd: int, payload: bytes) -> None:
    data = memoryview(_LENGTH.pack(len(payload)) + payload)
    while data:
        data = data[os.write(fd, data) :]


def _receive(fd: int) -> bytes | None:
    header = _read_exact(fd, _LENGTH.size)
    return None if header is None else _read_exact(fd, _LENGTH.unpack(header)[0])


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _with_deep_stack(function, *args):
    """``function(*args)``; on RecursionError once more in a thread with a large stack."""
    try:
        return function(*args)
    except RecursionError:
        pass
    outcome: list = []

    def target() -> None:
        sys.setrecursionlimit(200_000)
        try:
            outcome.append((True, function(*args)))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            outcome.append((False, exc))

    old_size = threading.stack_size(_DEEP_STACK_BYTES)
    try:
        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
    finally:
        threading.stack_size(old_size)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(ctypes.c_int(option), ctypes.c_ulong(value), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value})")


# --------------------------------------------------------------------------- the solution process
class _SolutionPickler(pickle.Pickler):
    """Sends what the solution returned; numpy values and defaultdicts travel as plain values."""

    def reducer_override(self, obj):
        if isinstance(obj, collections.defaultdict):
            return dict, (dict(obj),)
        module = type(obj).__module__ or ""
        if module.startswith("numpy") and hasattr(obj, "tolist"):
            plain = obj.tolist()
            return type(plain), (plain,)
        return NotImplemented


def _dumps_reply(reply: tuple) -> bytes:
    buffer = io.BytesIO()
    _SolutionPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(reply)
    return buffer.getvalue()


def _serve_solution(requests: int, replies: int) -> None:
    """The solution process: take the prefix, the solution and the entry point (never the test),
    run them, then answer calls of the entry point until EOF."""
    _prctl(_PR_SET_PDEATHSIG, _SIGKILL)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # the test arrives on the checker's stdin: never readable here
    os.dup2(devnull, 1)  # the checker's stdout, the channel of the verdict: never here
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's stdin until it exits
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    setup = _receive(requests)
    if setup is None:
        return
    import_prefix, solution, entry_point = pickle.loads(setup)  # noqa: S301 - from the checker
    module = types.ModuleType(_MODULE)
    sys.modules[_MODULE] = module
    try:
        exec(compile(import_prefix, "<import_prefix>", "exec"), module.__dict__)  # noqa: S102
        exec(compile(solution, "<solution>", "exec"), module.__dict__)  # noqa: S102 - the point of a grader
        target = eval(entry_point, module.__dict__)  # noqa: S307 - the row's entry point, e.g. Solution().f
        setup_error = None
    except BaseException:  # noqa: BLE001 - SystemExit included: reported as the solution's failure
        target, setup_error = None, traceback.format_exc(limit=5)
    while (request := _receive(requests)) is not None:
        if setup_error is not None:
            reply: tuple = ("error", setup_error)
        else:
            args, kwargs = pickle.loads(request)  # noqa: S301 - from the checker, trusted here
            try:
                result = target(*args, **kwargs)
                reply = ("ok", (result, args, kwargs))
            except BaseException:  # noqa: BLE001 - SystemExit included
                reply = ("error", traceback.format_exc(limit=5))
        try:
            payload = _with_deep_stack(_dumps_reply, reply)
        except BaseException as exc:  # noqa: BLE001 - e.g. a generator or a lambda returned
            payload = _dumps_reply(("error", f"the return value cannot be sent back: {type(exc).__name__}: {exc}"))
        _send(replies, payload)


# --------------------------------------------------------------------------- the checker process
class _DataOnly(pickle.Unpickler):
    """Admits plain values, a few standard containers and the import prefix's classes only."""

    def __init__(self, data: bytes, classes: dict[str, type]):
        super().__init__(io.BytesIO(data))
        self.classes = classes

    def find_class(self, module: str, name: str):
        if (module, name) in _PLAIN_GLOBALS:
            return super().find_class(module, name)
        if module == _MODULE and name in self.classes:
            return self.classes[name]
        raise pickle.UnpicklingError(f"the solution returned a {module}.{name}, which is not plain data")


def _copy_back(sent, returned) -> None:
    """Make an argument the checker holds look as the solution's call left it (in-place problems)."""
    if type(sent) is not type(returned):
        return
    if isinstance(sent, (list, bytearray)):
        sent[:] = returned
    elif isinstance(sent, (dict, set)):
        sent.clear()
        sent.update(returned)
    elif hasattr(sent, "__dict__") and type(sent).__module__ == _MODULE:
        sent.__dict__.clear()
        sent.__dict__.update(returned.__dict__)


class _Candidate:
    """The checker's stand-in for the entry point: each call is a round trip to the solution process."""

    def __init__(self, requests: int, replies: int, classes: dict[str, type]):
        self.requests, self.replies, self.classes = requests, replies, classes

    def __call__(self, *args, **kwargs):
        _send(self.requests, _with_deep_stack(pickle.dumps, (args, kwargs), pickle.HIGHEST_PROTOCOL))
        payload = _receive(self.replies)
        if payload is None:
            raise SolutionError("the solution process ended during the call")
        try:
            status, value = _with_deep_stack(lambda: _DataOnly(payload, self.classes).load())
        except Exception as exc:  # noqa: BLE001 - any malformed reply is the solution's failure
            raise SolutionError(f"unreadable reply from the solution: {exc}") from None
        if status != "ok":
            raise SolutionError(f"the solution failed:\n{value}")
        result, new_args, new_kwargs = value
        for sent, returned in zip(args, new_args):
            _copy_back(sent, returned)
        for key, sent in kwargs.items():
            _copy_back(sent, new_kwargs.get(key))
        return result


def run() -> None:
    """Read the case (JSON on stdin: import_prefix, solution, check, entry_point), run ``check`` (``def
    check(candidate): assert ...``) on the solution, print PASSED if the assert held."""
    _prctl(_PR_SET_DUMPABLE, 0)  # before the fork: the solution must never see into this process
    # The working directory is writable by the solution: nothing is imported from it from now on.
    here = os.path.realpath(os.getcwd())
    sys.path[:] = [entry for entry in sys.path if entry and os.path.realpath(entry) != here]
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    # Forked before the test is read: the solution process's memory never held it.
    pid = os.fork()
    if pid == 0:
        try:
            os.close(requests_w)
            os.close(replies_r)
            _serve_solution(requests_r, replies_w)
        finally:
            os._exit(0)
    os.close(requests_r)
    os.close(replies_w)
    spec = json.loads(sys.stdin.read())
    _send(requests_w, pickle.dumps((spec["import_prefix"], spec["solution"], spec["entry_point"])))
    checker = types.ModuleType(_MODULE)
    sys.modules[_MODULE] = checker
    exec(compile(spec["import_prefix"], "<import_prefix>", "exec"), checker.__dict__)  # noqa: S102
    classes = {
        name: value
        for name, value in checker.__dict__.items()
        if isinstance(value, type) and value.__module__ == _MODULE
    }
    exec(compile(spec["check"], "<test_code>", "exec"), checker.__dict__)  # noqa: S102 - the row's test code
    checker.check(_Candidate(requests_w, replies_r, classes))
    sys.stdout.write(PASSED + "\n")
    sys.stdout.flush()
    os._exit(0)  # the verdict is out: nothing (no atexit hook, no thread) may run after it
