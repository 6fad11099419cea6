"""Mount syscalls and the thread that builds each sandbox's private mount namespace.

Python's `os` has no `mount`, `setns` of a mount namespace, `open_tree` or `mount_setattr`, so
they are called through ctypes here, each raising an `OSError` that names the call and its
target. A sandbox's root filesystem (`t1.sandbox.isolation.rootfs`) is mounted in a mount namespace of its
own, never in the host's: a mount in the host's namespace is copied into every mount namespace
created after it, and with 8,000 of them a bubblewrap start took 172 ms instead of 8 ms.

`MountThread` is one thread with a private `fs_struct` (cwd and root; `setns` of a mount
namespace needs one) that moves between namespaces: `new_namespace` leaves it in a fresh copy
of the host's namespace (a few host mounts, cheap to copy), `inside` runs a function in one, and
both return it to the host's namespace afterwards. It shares the process's file table, so the
descriptors it opens are ordinary ones.
"""

from __future__ import annotations

import ctypes
import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TypeVar, cast

T = TypeVar("T")

CLONE_FS = 0x200
CLONE_NEWNS = 0x20000
MS_NOSUID, MS_NODEV = 0x2, 0x4
MS_REC, MS_PRIVATE, MS_SHARED = 0x4000, 0x40000, 0x100000
MNT_DETACH = 0x2
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
OPEN_TREE_CLONE = 0x1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOUNT_ATTR_IDMAP = 0x00100000
SYS_OPEN_TREE = 428  # the same numbers on every architecture (the unified syscall table)
SYS_MOVE_MOUNT, SYS_FSOPEN, SYS_FSCONFIG, SYS_FSMOUNT = 429, 430, 431, 432
SYS_MOUNT_SETATTR = 442
FSOPEN_CLOEXEC = FSMOUNT_CLOEXEC = 0x1
FSCONFIG_SET_STRING, FSCONFIG_CMD_CREATE = 1, 6
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
MOVE_MOUNT_F_EMPTY_PATH = 0x4

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def _enc(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    _check(_libc.mount(_enc(source), target.encode(), _enc(fstype), flags, _enc(data)),
           f"mount {fstype or 'flags ' + hex(flags)} on {target}")


def umount(target: str, flags: int = MNT_DETACH) -> None:
    _check(_libc.umount2(target.encode(), flags), f"umount {target}")


def setns(fd: int, nstype: int, what: str) -> None:
    _check(_libc.setns(fd, nstype), f"setns into {what}")


def unshare(flags: int, what: str) -> None:
    _check(_libc.unshare(flags), f"unshare {what}")


def idmapped_clone(path: str, userns_fd: int) -> int:
    """A detached copy of the mount at `path` (not its submounts) whose owners are mapped through
    the user namespace `userns_fd`: a file owned by uid N on disk appears owned by that namespace's N."""
    fd = _check(_libc.syscall(SYS_OPEN_TREE, AT_FDCWD, path.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC),
                f"open_tree {path}")
    attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns_fd)
    try:
        _check(_libc.syscall(SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)),
               f"mount_setattr idmap on a clone of {path}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def detached_mount(fstype: str, options: dict[str, str] | Sequence[tuple[str, str]], attrs: int) -> int:
    """A new mount of `fstype` with `options`, attached nowhere yet (`attach` puts it in place); its descriptor.

    Paths in `options` are resolved now, in the caller's mount namespace. Pairs may repeat a key
    (overlayfs's `lowerdir+` adds one lower layer each time).
    """
    fs = _check(_libc.syscall(SYS_FSOPEN, fstype.encode(), FSOPEN_CLOEXEC), f"fsopen {fstype}")
    try:
        for key, value in (options.items() if isinstance(options, dict) else options):
            _check(_libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_SET_STRING, key.encode(), value.encode(), 0),
                   f"fsconfig {fstype} {key}={value}")
        _check(_libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_CMD_CREATE, None, None, 0), f"create a {fstype} superblock")
        return _check(_libc.syscall(SYS_FSMOUNT, fs, FSMOUNT_CLOEXEC, attrs), f"fsmount {fstype}")
    finally:
        os.close(fs)


def attach(mount_fd: int, target: str) -> None:
    """Attach a detached mount (`detached_mount`) at `target` in the caller's mount namespace."""
    _check(_libc.syscall(SYS_MOVE_MOUNT, mount_fd, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH),
           f"move_mount onto {target}")


class MountThread:
    """A thread that runs mount work inside chosen mount namespaces, one job at a time."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]] = queue.SimpleQueue()
        started: Future[int] = Future()
        threading.Thread(target=self._run, args=(started,), name="t1-mounts", daemon=True).start()
        self._host_ns = started.result()

    def _run(self, started: Future[int]) -> None:
        try:
            unshare(CLONE_FS, "CLONE_FS (a cwd and root of this thread's own)")
            host = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            started.set_exception(exc)
            return
        started.set_result(host)
        while True:
            fn, result = self._jobs.get()
            try:
                result.set_result(fn())
            except BaseException as exc:  # handed to the caller, which raises it
                result.set_exception(exc)
            finally:
                setns(host, CLONE_NEWNS, "the host's mount namespace")
                os.chdir("/")

    def _call(self, fn: Callable[[], T]) -> T:
        result: Future[object] = Future()
        self._jobs.put((fn, result))
        return cast(T, result.result())

    def new_namespace(self, setup: Callable[[], None]) -> int:
        """Run `setup` in a new mount namespace (a private copy of the host's); a descriptor of it.

        The namespace lives while a process is in it or the descriptor is open.
        """
        def job() -> int:
            unshare(CLONE_NEWNS, "a mount namespace")
            mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing of ours propagates to the host
            setup()
            return os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        return self._call(job)

    def inside(self, ns_fd: int, fn: Callable[[], T]) -> T:
        """Run `fn` in the mount namespace `ns_fd`."""
        def job() -> T:
            setns(ns_fd, CLONE_NEWNS, "a sandbox's mount namespace")
            return fn()
        return self._call(job)


_thread: MountThread | None = None
_thread_lock = threading.Lock()


def mount_thread() -> MountThread:
    """The process's MountThread, started on first use."""
    global _thread
    with _thread_lock:
        if _thread is None:
            _thread = MountThread()
        return _thread
