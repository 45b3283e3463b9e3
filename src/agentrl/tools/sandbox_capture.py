"""What the zygote holds of one child and how it talks to it: the prepared child's pipes, the
capture that feeds its stdin and reads its stdout and stderr under a cap (draining the rest, so
the child never blocks on a full pipe), and the answer frame made of the result.

Part of the sandbox worker (:mod:`agentrl.tools.sandbox_worker`), run inside the zygote; only the
standard library, since it is imported before the preload modules.
"""

from __future__ import annotations

import os
import selectors
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class PreparedChild:
    pid: int
    workdir: str
    go_w: int
    stdin_w: int
    out_r: int
    err_r: int
    base_address_space: int  # the zygote's mapping when it forked the child


def mapped_bytes() -> int:
    """This process's mapped size (statm's first field, in pages): what a fresh fork starts with."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


class OutputCapture:
    """Feeds the child's stdin and reads its stdout and stderr up to a cap each, draining the rest."""

    def __init__(self, child: PreparedChild, cap: int, stdin: bytes | None):
        self.out_fd, self.err_fd, self.cap = child.out_r, child.err_r, cap
        self.buffers = {child.out_r: bytearray(), child.err_r: bytearray()}
        self.truncated = False
        self.selector = selectors.DefaultSelector()
        for fd in self.buffers:
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ)
        self.open_fds = set(self.buffers)
        self.stdin_fd: int | None = child.stdin_w
        self.stdin = memoryview(stdin or b"")
        if self.stdin:
            os.set_blocking(child.stdin_w, False)
            self.selector.register(child.stdin_w, selectors.EVENT_WRITE)
        else:
            self._close_stdin()

    def _close_stdin(self) -> None:
        if self.stdin_fd is not None:
            if self.stdin:
                self.selector.unregister(self.stdin_fd)
            os.close(self.stdin_fd)
            self.stdin_fd = None

    def _write_stdin(self) -> None:
        try:
            self.stdin = self.stdin[os.write(self.stdin_fd, self.stdin[: 1 << 16]) :]
        except BlockingIOError:
            return
        except BrokenPipeError:  # the code stopped reading its input: fine
            self.stdin = memoryview(b"")
            self.selector.unregister(self.stdin_fd)
            os.close(self.stdin_fd)
            self.stdin_fd = None
            return
        if not self.stdin:
            self.selector.unregister(self.stdin_fd)
            os.close(self.stdin_fd)
            self.stdin_fd = None

    def _read(self, fd: int) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            self.selector.unregister(fd)
            self.open_fds.discard(fd)
            return
        buffer = self.buffers[fd]
        room = self.cap - len(buffer)
        if room > 0:
            buffer += chunk[:room]
        if len(chunk) > max(room, 0):
            self.truncated = True

    def _handle(self, timeout: float, pidfd: int | None = None) -> bool:
        """Serve ready pipes for up to ``timeout``; True if the pidfd reported the exit."""
        for key, _ in self.selector.select(timeout):
            if key.fd == pidfd:
                return True
            if key.fd == self.stdin_fd:
                self._write_stdin()
            else:
                self._read(key.fd)
        return False

    def until_exit(self, pid: int, deadline: float) -> bool:
        """Serve the pipes until the main process exits (True) or the deadline passes (False)."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # kernel before 5.3: poll the exit instead of waiting for it
            return self._until_exit_polling(pid, deadline)
        self.selector.register(pidfd, selectors.EVENT_READ)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if self._handle(remaining, pidfd):
                    return True
        finally:
            self.selector.unregister(pidfd)
            os.close(pidfd)

    def _until_exit_polling(self, pid: int, deadline: float) -> bool:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._handle(min(remaining, 0.005))
            # waitid(WNOWAIT) leaves the child waitable, so the caller's waitpid still sees it.
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True

    def drain(self, deadline: float) -> None:
        """Read what is left once every writer is dead (or give up at the deadline)."""
        self._close_stdin()
        while self.open_fds:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._handle(remaining)

    def close(self) -> None:
        self._close_stdin()
        self.selector.close()
        for fd in self.buffers:
            os.close(fd)

    def text(self, fd: int) -> str:
        return self.buffers[fd].decode("utf-8", errors="replace")


def answer_frame(exited: bool, status: int, duration: float, capture: OutputCapture) -> dict[str, Any]:
    exit_code = os.waitstatus_to_exitcode(status)
    if not exited:
        verdict = "timeout"
    elif exit_code < 0:
        verdict = "killed"
    else:
        verdict = "ok" if exit_code == 0 else "error"
    return {
        "status": verdict,
        "stdout": capture.text(capture.out_fd),
        "stderr": capture.text(capture.err_fd),
        "exit_code": exit_code,
        "duration_s": round(duration, 6),
        "truncated": capture.truncated,
    }
