"""Linux isolation primitives for the sandbox worker: namespaces, mounts, capabilities.

Python 3.10/3.11 has no ``os.unshare`` and no wrapper for the new mount API, so these are thin
``ctypes`` calls into libc. Every function either succeeds or raises ``OSError`` naming the
call; the worker decides what a failure means (see :mod:`agentrl.tools.sandbox_worker`), and
reports what it obtained as a dict with the fields of :class:`agentrl.tools.sandbox.Isolation`.

Kept free of ``agentrl`` imports: the worker imports it before anything else is loaded.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import socket
import struct
import sys

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

# New mount API (Linux 5.2 / 5.12). These numbers come from the unified syscall table that
# every architecture shares for syscalls added after 5.1.
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_OPEN_TREE_CLONE = 1
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_KEEPCAPS = 8
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_DAC_READ_SEARCH = 2
# SECBIT_NOROOT, NO_SETUID_FIXUP, KEEP_CAPS and NO_CAP_AMBIENT_RAISE, each with its lock bit:
# uid 0 never regains capabilities, not even through exec of a set-uid binary.
_SECUREBITS_LOCKED_NOROOT = 0b1110_1111
_SECBIT_NOROOT_AND_KEEP_CAPS = 0b0001_0011  # NOROOT (locked) and KEEP_CAPS, which execve clears
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _raise_errno(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _path(path: str) -> bytes:
    return os.fsencode(path)


def unshare(flags: int) -> None:
    if _libc.unshare(ctypes.c_int(flags)) != 0:
        _raise_errno(f"unshare({flags:#x})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    ret = _libc.mount(
        None if source is None else _path(source),
        _path(target),
        None if fstype is None else fstype.encode(),
        ctypes.c_ulong(flags),
        None if data is None else data.encode(),
    )
    if ret != 0:
        _raise_errno(f"mount({source!r} on {target!r}, type {fstype!r})")


def umount(target: str) -> None:
    if _libc.umount2(_path(target), ctypes.c_int(MNT_DETACH)) != 0:
        _raise_errno(f"umount({target!r})")


def prctl(option: int, *args: int) -> None:
    values = [ctypes.c_ulong(a) for a in (*args, 0, 0, 0, 0)[:4]]
    if _libc.prctl(ctypes.c_int(option), *values) != 0:
        _raise_errno(f"prctl({option}, {args})")


def enter_user_namespace(flags: int) -> None:
    """Unshare ``flags`` plus a user namespace in which this process is root (unprivileged users)."""
    uid, gid = os.geteuid(), os.getegid()
    unshare(flags | CLONE_NEWUSER)
    # An unprivileged process may map only its own ids, and only after denying setgroups.
    with open("/proc/self/setgroups", "w") as fh:
        fh.write("deny")
    with open("/proc/self/uid_map", "w") as fh:
        fh.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as fh:
        fh.write(f"0 {gid} 1")


def clone_mount(path: str) -> int:
    """A detached copy of the mount tree at ``path`` (open_tree), to re-attach elsewhere."""
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPEN_TREE),
        ctypes.c_long(_AT_FDCWD),
        ctypes.c_char_p(_path(path)),
        ctypes.c_long(_OPEN_TREE_CLONE | _AT_RECURSIVE | os.O_CLOEXEC),
    )
    if fd < 0:
        _raise_errno(f"open_tree({path!r})")
    return fd


def attach_mount(tree_fd: int, target: str) -> None:
    ret = _libc.syscall(
        ctypes.c_long(_SYS_MOVE_MOUNT),
        ctypes.c_long(tree_fd),
        ctypes.c_char_p(b""),
        ctypes.c_long(_AT_FDCWD),
        ctypes.c_char_p(_path(target)),
        ctypes.c_long(_MOVE_MOUNT_F_EMPTY_PATH),
    )
    if ret != 0:
        _raise_errno(f"move_mount(onto {target!r})")


def set_mount_attributes_recursive(path: str, attributes: int) -> None:
    """Apply mount attributes (e.g. read-only) to every mount at and below ``path`` (mount_setattr)."""
    attr = _MountAttr(attributes, 0, 0, 0)
    ret = _libc.syscall(
        ctypes.c_long(_SYS_MOUNT_SETATTR),
        ctypes.c_long(_AT_FDCWD),
        ctypes.c_char_p(_path(path)),
        ctypes.c_long(_AT_RECURSIVE),
        ctypes.byref(attr),
        ctypes.c_long(ctypes.sizeof(attr)),
    )
    if ret != 0:
        _raise_errno(f"mount_setattr({path!r})")


def bring_loopback_up() -> None:
    """Enable ``lo`` in a fresh network namespace, so code may talk to itself over 127.0.0.1."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, siocgifflags, request)[:18])[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sh22x", b"lo", flags | iff_up))


def _last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as fh:
            return int(fh.read())
    except OSError:
        return 40


def _drop_bounding_set(keep: int | None = None) -> None:
    for cap in range(_last_capability() + 1):
        if cap == keep:
            continue
        try:
            prctl(PR_CAPBSET_DROP, cap)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: this kernel does not know that capability
                raise


def _set_capabilities(mask: int) -> None:
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    data[0].effective = data[0].permitted = data[0].inheritable = mask
    if _libc.capset(ctypes.byref(header), data) != 0:
        _raise_errno("capset")


def drop_all_capabilities() -> None:
    """Leave no capability in any set, and make uid 0 unable to regain one (securebits locked)."""
    _drop_bounding_set()
    prctl(PR_SET_SECUREBITS, _SECUREBITS_LOCKED_NOROOT)
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    _set_capabilities(0)


def switch_user(uid: int, keep_read_access: bool) -> None:
    """Become ``uid`` (no groups). With ``keep_read_access``, keep CAP_DAC_READ_SEARCH alone, also
    across exec (ambient), for when that uid could not otherwise read the Python installation."""
    if keep_read_access:
        _drop_bounding_set(keep=CAP_DAC_READ_SEARCH)
        prctl(PR_SET_SECUREBITS, _SECBIT_NOROOT_AND_KEEP_CAPS)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if keep_read_access:
        _set_capabilities(1 << CAP_DAC_READ_SEARCH)
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH)
        prctl(PR_SET_KEEPCAPS, 0)


def interpreter_paths() -> list[str]:
    """Directories the forked interpreter reads from: its prefix and every ``sys.path`` entry."""
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)}
    candidates.add(os.path.dirname(os.path.realpath(sys.executable)))
    for entry in sys.path:
        if entry and os.path.exists(entry):
            candidates.add(entry if os.path.isdir(entry) else os.path.dirname(entry))
    resolved = {os.path.realpath(p) for p in candidates if p} | {os.path.abspath(p) for p in candidates if p}
    return sorted(p for p in resolved if os.path.isdir(p))


def within(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or lies below it (both absolute and normalized)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def outermost(paths: list[str]) -> list[str]:
    """``paths`` without those that lie inside another of them."""
    unique = sorted(set(paths))
    return [p for p in unique if not any(p != q and within(p, q) for q in unique)]


def pivot_root(new_root: str, put_old: str) -> None:
    number = _SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"pivot_root: no syscall number known for {platform.machine()}")
    if _libc.syscall(ctypes.c_long(number), ctypes.c_char_p(_path(new_root)), ctypes.c_char_p(_path(put_old))) != 0:
        _raise_errno(f"pivot_root({new_root!r}, {put_old!r})")


def _attach_copy(source: str, target_root: str) -> None:
    """Bind ``source`` (a directory or a file of the current root) at the same path under ``target_root``."""
    target = target_root.rstrip("/") + source
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()  # noqa: SIM115 - an empty mount point
    tree = clone_mount(source)
    try:
        attach_mount(tree, target)
    finally:
        os.close(tree)


def enter_private_root(staging: str, visible: list[str], devices: list[str]) -> str | None:
    """Make a root that holds only ``visible`` (bind mounts of these paths, files or directories) and
    ``devices`` (e.g. ``/dev/null``), and pivot into it; the old root is unmounted.

    ``staging`` is an existing directory to build the new root on (a tmpfs is mounted there, in
    this mount namespace only). Top-level symlinks such as ``/bin -> usr/bin`` are recreated as
    symlinks. A new ``/proc`` is mounted; returns why that failed, or None. The caller mounts the
    private temporary directories and sets the read-only flags.
    """
    mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4m")
    for path in outermost(visible):
        if os.path.islink(path) and os.path.dirname(path) == "/":
            os.symlink(os.readlink(path), staging + path)
        elif os.path.exists(path):
            _attach_copy(path, staging)
    os.makedirs(staging + "/dev", exist_ok=True)
    mount("tmpfs", staging + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for device in devices:
        if os.path.exists(device):
            _attach_copy(device, staging)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        os.symlink(target, f"{staging}/dev/{name}")
    os.symlink("/proc/self/fd/2", f"{staging}/dev/stderr")
    for directory in ("/proc", "/tmp", "/var/tmp", "/dev/shm", "/.old-root"):
        os.makedirs(staging + directory, exist_ok=True)
    pivot_root(staging, staging + "/.old-root")
    os.chdir("/")
    proc_error = None
    try:
        # Before the old root goes: in a user namespace a new proc needs a fully visible one.
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as exc:
        proc_error = str(exc)
    umount("/.old-root")
    os.rmdir("/.old-root")
    return proc_error
