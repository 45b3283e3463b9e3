"""The child the sandbox zygote forks for one execution: confine it, then run the code in it.

:func:`run_child` runs right after the fork, before the request arrives: it confines the child
(own session, resource limits, an unprivileged uid or no capabilities, no-new-privs) and waits
for the zygote's "go" on a pipe; :func:`run_user_code` then runs ``main.py`` as ``python
main.py`` would.

The child inherits a warm interpreter, so the state a fresh interpreter starts with is rebuilt:
``__main__`` (a new module with ``__name__ == "__main__"`` and ``__file__``), ``sys.argv``,
``sys.path[0]`` (the working directory, as for a script there), ``sys.std*`` over the capture
pipes, ``os.environ``, and fresh seeds for ``random`` and ``numpy.random`` (otherwise every
child would replay the zygote's random stream). The ending follows the interpreter's: uncaught
exceptions print a traceback that starts at the user's module, ``SystemExit`` sets the exit
status, non-daemon threads are joined, ``atexit`` handlers run, the streams are flushed.

Known differences from a cold interpreter: modules preloaded by the zygote are already in
``sys.modules`` (that is the point) and the string hash seed is the zygote's, fixed per worker.
"""

from __future__ import annotations

import atexit
import builtins
import os
import resource
import signal
import struct
import sys
import threading
import traceback
import types
from dataclasses import dataclass
from typing import Any

from agentrl.tools import sandbox_isolation as iso

SETUP_FAILED_EXIT = 125
_GO_FD = 3
# "go": b"g" and the request's address-space limit in bytes (little-endian u64; 0: keep the prepared one).
GO_MESSAGE_BYTES = 9


@dataclass(frozen=True)
class Confinement:
    """Everything the child needs to confine itself, decided by the zygote before the fork."""

    workdir: str
    uid: int | None  # switch to this uid; None: keep the uid and drop every capability
    keep_read_access: bool  # with ``uid``: keep CAP_DAC_READ_SEARCH (the uid cannot read Python)
    share_host_uid: bool  # the uid is the host user's: the process limit must count its processes
    address_space: int  # bytes: the forked interpreter's mapping plus ``memory_mb``
    limits: dict[str, Any]
    env: dict[str, str]


def run_child(confinement: Confinement, stdin_fd: int, out_w: int, err_w: int, go_fd: int) -> None:
    """Confine this freshly forked child, wait for "go", run ``main.py``; never returns."""
    try:
        _confine(confinement, stdin_fd, out_w, err_w, go_fd)
        go = os.read(_GO_FD, GO_MESSAGE_BYTES)
        if go[:1] != b"g":
            os._exit(0)  # the zygote went away without a job for this child
        os.close(_GO_FD)
        (address_space,) = struct.unpack("<Q", go[1:])
        if address_space:  # the request's own memory limit: lowering a limit needs no privilege
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        code_path = os.path.join(confinement.workdir, "main.py")
        with open(code_path, encoding="utf-8", errors="surrogatepass") as fh:
            code = fh.read()
    except BaseException:  # noqa: BLE001 - a failure before the code started is the sandbox's: say so
        try:
            os.write(2, ("sandbox setup failed:\n" + traceback.format_exc()).encode())
        finally:
            os._exit(SETUP_FAILED_EXIT)
    run_user_code(code, code_path, confinement.workdir, confinement.env)


def _confine(confinement: Confinement, stdin_fd: int, out_w: int, err_w: int, go_fd: int) -> None:
    assert min(stdin_fd, out_w, err_w, go_fd) > _GO_FD, "the pipes must not collide with the target fds 0-3"
    os.setsid()  # own session and process group: the code's signals to "its group" stay in it
    iso.prctl(iso.PR_SET_PDEATHSIG, signal.SIGKILL)
    for target, source in ((0, stdin_fd), (1, out_w), (2, err_w), (_GO_FD, go_fd)):
        os.dup2(source, target)
    os.closerange(_GO_FD + 1, os.sysconf("SC_OPEN_MAX"))  # the protocol pipes and everything else
    os.chdir(confinement.workdir)
    limits = confinement.limits
    cpu = int(limits["cpu_time_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    file_bytes = int(limits["max_file_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    processes = int(limits["max_processes"])
    if confinement.share_host_uid:
        processes += _processes_of(os.getuid())
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    resource.setrlimit(resource.RLIMIT_AS, (confinement.address_space, confinement.address_space))
    if confinement.uid is not None:
        iso.switch_user(confinement.uid, keep_read_access=confinement.keep_read_access)
    else:
        iso.drop_all_capabilities()
    iso.prctl(iso.PR_SET_NO_NEW_PRIVS, 1)
    iso.prctl(iso.PR_SET_DUMPABLE, 1)  # the code may read its own /proc/self again


def _processes_of(uid: int) -> int:
    """The kernel counts every process of a uid against RLIMIT_NPROC, not only the sandbox's."""
    running = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                running += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return running


def _fresh_streams() -> tuple:
    stdin = open(0, encoding="utf-8", errors="strict", closefd=False)  # noqa: SIM115 - lives as sys.stdin
    stdout = open(1, "w", encoding="utf-8", errors="strict", closefd=False)  # noqa: SIM115
    stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)  # noqa: SIM115
    return stdin, stdout, stderr


def _reseed() -> None:
    if "random" in sys.modules:
        sys.modules["random"].seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _exit_status(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish(status: int) -> int:
    """What the interpreter does after ``__main__`` ends; returns the final exit status."""
    try:
        threading._shutdown()  # joins non-daemon threads, as at a normal interpreter exit
    except BaseException:  # noqa: BLE001 - e.g. KeyboardInterrupt while joining
        status = status or 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream: nothing more to say
            status = status or 120
    return status


def run_user_code(code: str, code_path: str, workdir: str, env: dict[str, str]) -> None:
    """Execute ``code`` as the script ``code_path``, then exit the process (never returns)."""
    sys.stdin, sys.stdout, sys.stderr = _fresh_streams()
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    os.environ.clear()
    os.environ.update(env, HOME=workdir, PWD=workdir)
    sys.argv = [code_path]
    sys.path[0:0] = [workdir]
    main = types.ModuleType("__main__")
    main.__file__ = code_path
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    _reseed()
    status = 0
    try:
        compiled = compile(code, code_path, "exec")
        exec(compiled, main.__dict__)  # noqa: S102 - running the code is the purpose of the sandbox
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException as exc:  # noqa: BLE001 - the interpreter reports every uncaught exception
        # Drop this frame, so the traceback reads as the interpreter's own (a SyntaxError from
        # compile() has no user frame at all and prints as "File ..., line N" only).
        traceback = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        sys.excepthook(type(exc), exc.with_traceback(traceback), traceback)
        status = 1
    os._exit(_finish(status))
