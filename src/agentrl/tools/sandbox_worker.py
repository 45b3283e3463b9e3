"""The sandbox worker process: a pre-started interpreter that forks one child per execution.

Started by :class:`agentrl.tools.sandbox.LocalSandbox` as ``python -I -B -c <bootstrap> <json>``
with a scrubbed environment. Process layout, per worker::

    host process ── pipes ──> outer (this module's main) ──fork──> zygote ──fork──> child (user code)

* **outer** enters the new namespaces (``unshare``) and forks once, because a new PID namespace
  applies to children only; it then just waits for the zygote.
* **zygote** is PID 1 of that namespace. It isolates the filesystem, imports the preload modules
  (numpy, sympy, ... : an execution pays for none of them), then serves requests from the host,
  always one child ahead: the child for the next request is forked (and confines itself) while
  the host handles the previous answer, and only waits for "go". Per request the zygote writes
  ``main.py``, says go, feeds stdin, collects the output under a cap, enforces the wall-clock
  timeout, kills every other process of the namespace (``kill(-1)`` from PID 1) and reaps them;
  after answering it resets the private temporary directories. When the host closes the pipe,
  the zygote exits and the kernel kills whatever is left in the namespace.
* **child** drops privileges (its own session, resource limits, an unprivileged uid or no
  capabilities at all, no-new-privs), rebuilds ``__main__``, ``sys.std*``, ``sys.argv`` and
  ``os.environ`` as a fresh ``python main.py`` would have them, and runs the code.

Protocol: frames of a 4-byte big-endian length and UTF-8 JSON. Requests ``{code, stdin,
timeout_s}``; answers ``{status, stdout, stderr, exit_code, duration_s, truncated}``. The first
frame the worker sends is ``{ready, isolation, preloaded, not_importable, notes}``. JSON rather
than pickle: a compromised worker must not be able to run code in the host by what it answers.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import shutil
import signal
import struct
import sys
import tempfile
import time
from typing import Any

from agentrl.tools import sandbox_isolation as iso
from agentrl.tools.sandbox_capture import OutputCapture, PreparedChild, answer_frame, mapped_bytes
from agentrl.tools.sandbox_child import SETUP_FAILED_EXIT, Confinement, run_child

FRAME_HEADER = struct.Struct(">I")  # shared with the host side (agentrl.tools.sandbox)
_NAMESPACE_FLAGS = iso.CLONE_NEWNS | iso.CLONE_NEWPID | iso.CLONE_NEWNET | iso.CLONE_NEWIPC | iso.CLONE_NEWUTS
_PRIVATE_TMP_DIRECTORIES = ("/tmp", "/var/tmp", "/dev/shm")
# What of the host the private root shows besides the Python installation (all read-only): system
# programs and libraries, and the few files of /etc the dynamic loader and the C library read.
_SYSTEM_PATHS = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
)
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_STAGING_DIRECTORY = "/tmp"  # the new root is built on a tmpfs there (in this mount namespace only)
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PRIVATE_WORKDIR = "/tmp/run"
_REAP_SECONDS = 2.0
_DRAIN_SECONDS = 1.0


# --------------------------------------------------------------------------- framing
def write_frame(fd: int, message: dict[str, Any]) -> None:
    payload = json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass")
    data = memoryview(FRAME_HEADER.pack(len(payload)) + payload)
    while data:
        data = data[os.write(fd, data) :]


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = os.read(fd, remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> dict[str, Any] | None:
    """The next message, or None at end of stream."""
    header = _read_exact(fd, FRAME_HEADER.size)
    if header is None:
        return None
    payload = _read_exact(fd, FRAME_HEADER.unpack(header)[0])
    return None if payload is None else json.loads(payload.decode("utf-8", "surrogatepass"))


# --------------------------------------------------------------------------- outer process
def main(config_json: str) -> int:
    config = json.loads(config_json)
    # The protocol moves off fds 0/1 so that nothing printed by accident can corrupt it.
    requests_fd, answers_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    namespaces = {"obtained": False, "user_namespace": False, "notes": []}
    if config["namespaces"]:
        namespaces = _enter_namespaces()
    zygote = os.fork()
    if zygote == 0:
        exit_code = 1
        try:
            exit_code = _zygote_main(config, requests_fd, answers_fd, namespaces)
        except BaseException as exc:  # noqa: BLE001 - the zygote must never fall back into the outer's code
            print(f"agentrl sandbox worker: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        finally:
            os._exit(exit_code)
    os.close(requests_fd)
    os.close(answers_fd)
    _, status = os.waitpid(zygote, 0)
    return os.waitstatus_to_exitcode(status)


def _enter_namespaces() -> dict[str, Any]:
    notes = []
    if os.geteuid() == 0:
        try:
            iso.unshare(_NAMESPACE_FLAGS)
            return {"obtained": True, "user_namespace": False, "notes": notes}
        except OSError as exc:
            notes.append(f"namespaces as root: {exc}")
    try:
        iso.enter_user_namespace(_NAMESPACE_FLAGS)
        return {"obtained": True, "user_namespace": True, "notes": notes}
    except OSError as exc:
        notes.append(f"namespaces through a user namespace: {exc}")
    return {"obtained": False, "user_namespace": False, "notes": notes}


def python_paths() -> list[str]:
    """The interpreter's directories the private root shows, never ``/`` and never a source tree of
    this package outside the installation (an editable install points into a repository)."""
    prefixes = [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)]
    sources = [_PACKAGE_ROOT, *(p for p in sys.path if p and os.path.isdir(os.path.join(p, "agentrl")))]
    repositories = {
        os.path.realpath(source)
        for source in sources
        if not any(iso.within(os.path.realpath(source), prefix) for prefix in prefixes)
    }
    return [
        path
        for path in iso.interpreter_paths()
        if path != "/" and not any(iso.within(path, repo) or iso.within(repo, path) for repo in repositories)
    ]


# --------------------------------------------------------------------------- zygote
class _Zygote:
    def __init__(self, config: dict[str, Any], namespaces: dict[str, Any]):
        self.limits = config["limits"]
        self.env = config["env"]
        self.tmpfs_mb = config["tmpfs_mb"]
        self.notes: list[str] = list(namespaces["notes"])
        self.in_namespaces = namespaces["obtained"]
        self.isolation = {
            "network": self.in_namespaces,
            "pid_namespace": self.in_namespaces and os.getpid() == 1,
            "mount_namespace": self.in_namespaces,
            "private_tmp": False,
            "readonly_root": False,
            "private_root": False,
            "user_switch": os.geteuid() == 0 and not namespaces["user_namespace"],
            "read_override": False,
            "user_namespace": namespaces["user_namespace"],
        }
        self.uid = config["uid"]
        self._tmp_resident: list[str] = []

    # ---------------------------------------------------------------- setup
    def isolate(self) -> None:
        iso.prctl(iso.PR_SET_DUMPABLE, 0)  # code running as the same uid must not ptrace the zygote
        if not self.isolation["pid_namespace"]:
            # Orphans of the code are re-parented here, so they can be found and reaped.
            iso.prctl(iso.PR_SET_CHILD_SUBREAPER, 1)
        if self.in_namespaces:
            self._isolate_filesystem()
            try:
                iso.bring_loopback_up()
            except OSError as exc:
                self.notes.append(f"loopback: {exc}")
        unreadable = self._path_uid_cannot_read() if self.isolation["user_switch"] else None
        if unreadable is not None and self.isolation["private_root"]:
            # No capability that bypasses file permissions where the file system is isolated.
            raise RuntimeError(
                f"the sandbox uid {self.uid} cannot read {unreadable}, part of the Python installation; "
                "make it readable by others (chmod -R o+rX) so that sandboxed code can import from it"
            )
        if unreadable is not None:
            self.isolation["read_override"] = True
            self.notes.append(
                f"uid {self.uid} cannot read {unreadable} and there is no private root; the code keeps "
                "CAP_DAC_READ_SEARCH and so can read every file"
            )

    def _isolate_filesystem(self) -> None:
        try:
            iso.mount(None, "/", None, iso.MS_REC | iso.MS_PRIVATE)  # nothing done here reaches the host
        except OSError as exc:
            # Without private propagation any mount below would appear on the host: none is made.
            self.isolation["mount_namespace"] = False
            self.notes.append(f"private mount propagation: {exc}")
            return
        python = python_paths()
        in_tmp = [p for p in python if any(iso.within(p, d) for d in _PRIVATE_TMP_DIRECTORIES)]
        # Clones of what lives in /tmp (a venv, a conda env), taken before the new root covers it.
        trees = [(path, iso.clone_mount(path)) for path in iso.outermost(in_tmp)]
        visible = [*_SYSTEM_PATHS, *(p for p in python if p not in in_tmp)]
        try:
            proc_error = iso.enter_private_root(_STAGING_DIRECTORY, visible, list(_DEVICES))
            self.isolation["private_root"] = True
            if proc_error:
                self.notes.append(f"private /proc: {proc_error}")
        except OSError as exc:
            self.notes.append(f"private root (the code sees every world-readable file): {exc}")
        try:
            iso.set_mount_attributes_recursive("/", iso.MOUNT_ATTR_RDONLY | iso.MOUNT_ATTR_NOSUID)
            self.isolation["readonly_root"] = True
        except OSError as exc:
            self.notes.append(f"read-only root: {exc}")
        try:
            self._mount_private_tmp(trees)
            self.isolation["private_tmp"] = True
            self._tmp_resident = [path for path, _ in trees]
        except OSError as exc:
            self.notes.append(f"private tmp: {exc}")
        finally:
            for _, tree in trees:
                os.close(tree)

    def _mount_private_tmp(self, trees: list[tuple[str, int]]) -> None:
        """Fresh tmpfs mounts for /tmp, /var/tmp, /dev/shm; ``trees`` (read-only) re-attached inside."""
        for directory in _PRIVATE_TMP_DIRECTORIES:
            if os.path.isdir(directory):
                size = self.tmpfs_mb if directory == "/tmp" else max(1, self.tmpfs_mb // 4)
                iso.mount("tmpfs", directory, "tmpfs", iso.MS_NOSUID | iso.MS_NODEV, f"mode=1777,size={size}m")
        for path, tree in trees:
            os.makedirs(path, exist_ok=True)
            iso.attach_mount(tree, path)
            iso.set_mount_attributes_recursive(path, iso.MOUNT_ATTR_RDONLY | iso.MOUNT_ATTR_NOSUID)

    def _reset_private_tmp(self) -> None:
        """Replace the private tmpfs mounts by empty ones: O(1), whatever the code left there."""
        trees = [(path, iso.clone_mount(path)) for path in self._tmp_resident]
        try:
            for directory in _PRIVATE_TMP_DIRECTORIES:
                if os.path.isdir(directory):
                    iso.umount(directory)
            self._mount_private_tmp(trees)
        finally:
            for _, tree in trees:
                os.close(tree)

    def _path_uid_cannot_read(self) -> str | None:
        """The first interpreter path a child running as ``self.uid`` cannot read, or None."""
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_fd)
                iso.switch_user(self.uid, keep_read_access=False)
                executable = os.path.realpath(sys.executable)
                for path in python_paths():
                    try:
                        os.listdir(path)
                    except OSError:
                        os.write(write_fd, os.fsencode(path))
                        break
                else:
                    if not os.access(executable, os.X_OK):
                        os.write(write_fd, os.fsencode(executable))
            finally:
                os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as reader:
            unreadable = reader.read()
        os.waitpid(pid, 0)
        return os.fsdecode(unreadable) if unreadable else None

    def preload(self, modules: list[str]) -> tuple[list[str], list[str]]:
        loaded, missing = [], []
        for name in modules:
            try:
                importlib.import_module(name)
                loaded.append(name)
            except Exception:  # noqa: BLE001 - an optional module may fail to import in any way
                missing.append(name)
        # Objects alive now are shared by every child; freezing them keeps the collector from
        # touching (and so copying) their pages after each fork.
        gc.collect()
        gc.freeze()
        return loaded, missing

    # ---------------------------------------------------------------- executions
    def serve(self, requests_fd: int, answers_fd: int) -> int:
        """Answer requests until the host closes the pipe, always one child ahead."""
        prepared = self._prepare_or_none()
        while True:
            request = read_frame(requests_fd)
            if request is None:
                self._discard(prepared)
                return 0
            child = prepared
            try:
                child = child or self._prepare()
                answer = self._execute(child, request)
            except Exception as exc:  # noqa: BLE001 - one broken execution must not take the worker down
                answer = {
                    "status": "killed",
                    "stdout": "",
                    "stderr": f"sandbox error: {type(exc).__name__}: {exc}",
                    "exit_code": None,
                    "duration_s": 0.0,
                    "truncated": False,
                    "infra_failure": True,
                }
            write_frame(answers_fd, answer)
            # Cleaning up and forking the next child happen while the host handles the answer.
            try:
                self._clean_up(child)
            except OSError as exc:
                print(f"agentrl sandbox worker: cleaning up: {exc}", file=sys.stderr, flush=True)
            prepared = self._prepare_or_none()

    def _discard(self, child: PreparedChild | None) -> None:
        """End a prepared child that will get no job (closing "go" makes it exit)."""
        if child is None:
            return
        for fd in (child.go_w, child.stdin_w, child.out_r, child.err_r):
            os.close(fd)
        os.waitpid(child.pid, 0)
        self._clean_up(child)

    def _prepare_or_none(self) -> PreparedChild | None:
        try:
            return self._prepare()
        except OSError as exc:  # e.g. fork refused: retried when the request arrives
            print(f"agentrl sandbox worker: preparing a child: {exc}", file=sys.stderr, flush=True)
            return None

    def _prepare(self) -> PreparedChild:
        """Fork the child for the next execution; it confines itself, then waits for "go"."""
        workdir = self._make_workdir()
        go_r, go_w = os.pipe()
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        base_address_space = mapped_bytes()
        confinement = Confinement(
            workdir=workdir,
            uid=self.uid if self.isolation["user_switch"] else None,
            keep_read_access=self.isolation["read_override"],
            share_host_uid=not (self.isolation["user_switch"] or self.isolation["user_namespace"]),
            address_space=base_address_space + (int(self.limits["memory_mb"]) << 20),
            limits=self.limits,
            env=self.env,
        )
        pid = os.fork()
        if pid == 0:
            try:
                run_child(confinement, stdin_r, out_w, err_w, go_r)
            finally:
                os._exit(SETUP_FAILED_EXIT)
        for fd in (go_r, stdin_r, out_w, err_w):
            os.close(fd)
        return PreparedChild(pid, workdir, go_w, stdin_w, out_r, err_r, base_address_space)

    def _make_workdir(self) -> str:
        if self.isolation["private_tmp"]:
            # Always the same path (the private /tmp is new for each execution), so tracebacks
            # and anything else that shows the path are reproducible.
            workdir = _PRIVATE_WORKDIR
            os.mkdir(workdir, 0o700)
        else:
            workdir = tempfile.mkdtemp(prefix="agentrl-sandbox-")
        if self.isolation["user_switch"]:
            os.chown(workdir, self.uid, self.uid)
        return workdir

    def _execute(self, child: PreparedChild, request: dict[str, Any]) -> dict[str, Any]:
        try:
            with open(os.path.join(child.workdir, "main.py"), "w", encoding="utf-8", errors="surrogatepass") as fh:
                fh.write(request["code"])
        except (OSError, KeyError, TypeError):
            self._discard(child)  # the child never got its "go": end it before answering
            raise
        stdin = request.get("stdin")
        stdin_bytes = None if stdin is None else stdin.encode("utf-8", "surrogatepass")
        capture = OutputCapture(child, self.limits["max_output_bytes"], stdin_bytes)
        started = time.monotonic()
        try:
            # A request's own memory limit (below the prepared one) travels with "go": the child
            # lowers its address-space limit before it runs the code.
            memory_mb = request.get("memory_mb")
            address_space = 0 if memory_mb is None else child.base_address_space + (int(memory_mb) << 20)
            try:
                os.write(child.go_w, b"g" + struct.pack("<Q", address_space))
            except BrokenPipeError:
                pass  # the child died before it could start: its exit status tells how
            os.close(child.go_w)
            exited = capture.until_exit(child.pid, started + float(request["timeout_s"]))
            duration = time.monotonic() - started
            self._kill_everything(child.pid)
            _, status = os.waitpid(child.pid, 0)
            capture.drain(time.monotonic() + _DRAIN_SECONDS)
        finally:
            capture.close()
        self._reap()
        return answer_frame(exited, status, duration, capture)

    def _clean_up(self, child: PreparedChild | None) -> None:
        if self.isolation["private_tmp"]:
            self._reset_private_tmp()
        elif child is not None:
            shutil.rmtree(child.workdir, ignore_errors=True)

    def _kill_everything(self, pid: int) -> None:
        """Kill the code's main process and every process it started, however it detached them."""
        if self.isolation["pid_namespace"]:
            assert os.getpid() == 1, "kill(-1) outside a PID namespace would hit the whole machine"
            os.kill(-1, signal.SIGKILL)  # from PID 1: every process of the namespace but itself
            return
        for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                target()
            except ProcessLookupError:
                pass
        if self.isolation["user_switch"]:
            _kill_all_of_uid(self.uid)
        for _ in range(5):
            descendants = _descendants(os.getpid())
            if not descendants:
                break
            for child in descendants:
                try:
                    os.kill(child, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _reap(self) -> None:
        deadline = time.monotonic() + _REAP_SECONDS
        while True:
            try:
                reaped, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if reaped == 0:
                if time.monotonic() > deadline:  # stuck in the kernel (D state): reaped next time
                    return
                time.sleep(0.001)


def _kill_all_of_uid(uid: int) -> None:
    """Without a PID namespace: kill(-1) from a helper running as the sandbox uid hits only its processes."""
    helper = os.fork()
    if helper == 0:
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            if os.getuid() == uid and os.geteuid() == uid and uid != 0:
                os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(helper, 0)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, frontier = [], [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child)
    return found


def _zygote_main(config: dict[str, Any], requests_fd: int, answers_fd: int, namespaces: dict[str, Any]) -> int:
    iso.prctl(iso.PR_SET_PDEATHSIG, signal.SIGKILL)
    zygote = _Zygote(config, namespaces)
    zygote.isolate()
    loaded, missing = zygote.preload(config["preload"])
    ready = {"ready": True, "isolation": zygote.isolation, "preloaded": loaded, "not_importable": missing}
    write_frame(answers_fd, {**ready, "notes": zygote.notes})
    return zygote.serve(requests_fd, answers_fd)
