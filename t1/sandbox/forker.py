"""Process starts from a thread with its own, nearly empty file table.

A fork copies the forking task's file table and the child then closes every inherited
descriptor; the local sandbox server holds a socket and three pipes per live sandbox, so forking
from its table made each process start cost time in proportion to the number of live sandboxes
(0.74 ms with 100 open files, 3-4 ms with 16,000). `popen` forks from the `Forker` thread instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import logging
import os
import queue
import socket
import subprocess
import threading
from concurrent.futures import Future
from typing import Any

_CLONE_FILES = 0x400
_STDIO = ("stdin", "stdout", "stderr")

log = logging.getLogger(__name__)


class Forker:
    """Runs `subprocess.Popen` in a thread with a private file table that holds only stdio and a socket.

    Descriptors a child needs (a PTY slave, an info pipe) go to that thread over the socket
    (SCM_RIGHTS) and the parent ends of new pipes come back the same way, so the returned `Popen`
    is used exactly like one made here. Children stay children of this process (waits, pidfds and
    process groups are unchanged), and since the thread never exits, `PR_SET_PDEATHSIG` (bubblewrap's
    `--die-with-parent`) fires only when the process dies. The cyclic GC is off while the thread
    runs Python code: a finalizer run there would close a number in the wrong file table.
    """

    def __init__(self) -> None:
        self._ours, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._jobs: queue.SimpleQueue[tuple[list[str], dict[str, Any], int, list[Any], threading.Event]] = \
            queue.SimpleQueue()
        self._lock = threading.Lock()
        started: Future[None] = Future()
        threading.Thread(target=self._run, args=(started,), name="t1-forker", daemon=True).start()
        started.result()

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """`subprocess.Popen(argv, **kwargs)`, forked from the thread (blocks; call it off the loop)."""
        given = [kwargs[name] for name in _STDIO if isinstance(kwargs.get(name), int) and kwargs[name] >= 0]
        given += list(kwargs.get("pass_fds", ()))
        _reap_abandoned()  # here, in the process's file table (see _popen_without_cleanup)
        slot: list[Any] = []
        done = threading.Event()
        with self._lock:  # one exchange on the socket at a time
            if given:
                socket.send_fds(self._ours, [b"in"], given)
            self._jobs.put((argv, kwargs, len(given), slot, done))
            done.wait()
            result = slot.pop()
            if isinstance(result, BaseException):
                raise result
            proc, piped = result
            if piped:
                _, fds, _, _ = socket.recv_fds(self._ours, 16, len(piped))
                if len(fds) != len(piped):  # the kernel drops what does not fit in our table
                    for fd in fds:
                        os.close(fd)
                    proc.kill()
                    proc.wait()
                    raise OSError(errno.EMFILE, f"no room for the pipes of {argv[0]!r} in this process's file table")
                for name, fd in zip(piped, fds, strict=True):
                    setattr(proc, name, os.fdopen(fd, "wb" if name == "stdin" else "rb"))
        return proc  # type: ignore[no-any-return]

    def _run(self, started: Future[None]) -> None:
        try:
            if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_FILES) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_FILES)")
            keep = self._theirs.fileno()
            os.closerange(3, keep)  # only in this thread's copy of the table
            os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        except OSError as exc:
            started.set_exception(exc)
            return
        started.set_result(None)
        while True:
            argv, kwargs, num_fds, slot, done = self._jobs.get()
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                slot.append(self._fork(argv, kwargs, num_fds))
            except BaseException as exc:  # handed to the caller, which raises it
                slot.append(exc)
            finally:
                if gc_was_enabled:
                    gc.enable()
            # Nothing here may hold the result once the caller runs: an object freed in this
            # thread closes its descriptor in this thread's file table, not the process's.
            del argv, kwargs, slot
            done.set()

    def _fork(self, argv: list[str], kwargs: dict[str, Any], num_fds: int) -> tuple[subprocess.Popen[bytes], list[str]]:
        to_close: set[int] = set()
        try:
            received: list[int] = []
            if num_fds:
                _, received, _, _ = socket.recv_fds(self._theirs, 16, num_fds)
            to_close.update(received)
            wanted = list(kwargs.get("pass_fds", ()))
            # the child must find the passed ones at the numbers its command line names
            fds = [_dup_away(fd, wanted) if fd in wanted else fd for fd in received]
            to_close.update(fds)
            kwargs = dict(kwargs)
            rest = iter(fds)
            for name in _STDIO:
                if isinstance(kwargs.get(name), int) and kwargs[name] >= 0:
                    kwargs[name] = next(rest)
            for fd, number in zip(rest, wanted, strict=True):
                os.dup2(fd, number, inheritable=False)
                to_close.add(number)
            proc = _popen_without_cleanup(argv, kwargs)
        finally:
            for fd in to_close:
                with contextlib.suppress(OSError):
                    os.close(fd)
        piped = [name for name in _STDIO if getattr(proc, name) is not None]
        try:
            if piped:
                socket.send_fds(self._theirs, [b"out"], [getattr(proc, name).fileno() for name in piped])
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            for name in piped:
                getattr(proc, name).close()
                setattr(proc, name, None)
        return proc, piped


def _popen_without_cleanup(argv: list[str], kwargs: dict[str, Any]) -> subprocess.Popen[bytes]:
    """`Popen` without its reaping of abandoned `Popen` objects, which could free one in this thread.

    `Popen()` first polls the objects dropped before their process ended (`subprocess._active`)
    and releases those that have; one freed here would close its pipes in the wrong file table.
    `_reap_abandoned` does that work in the caller's thread instead.
    """
    active = getattr(subprocess, "_active", None)
    if active is None:
        return subprocess.Popen(argv, **kwargs)
    subprocess._active = []  # type: ignore[attr-defined]
    try:
        return subprocess.Popen(argv, **kwargs)
    finally:
        dropped_meanwhile = subprocess._active  # type: ignore[attr-defined]
        subprocess._active = active  # type: ignore[attr-defined]
        active.extend(dropped_meanwhile)


def _reap_abandoned() -> None:
    cleanup = getattr(subprocess, "_cleanup", None)
    if cleanup is not None:
        cleanup()


def _dup_away(fd: int, taken: list[int]) -> int:
    """A copy of `fd` at a number not in `taken` (the original is closed)."""
    spare = []
    new = os.dup(fd)
    while new in taken:
        spare.append(new)
        new = os.dup(fd)
    for extra in [fd, *spare]:
        os.close(extra)
    return new


_forker: Forker | None = None
_forker_failed = False
_forker_lock = threading.Lock()


def forker() -> Forker | None:
    """The process's Forker, started on first use; None where a thread cannot have its own file table."""
    global _forker, _forker_failed
    with _forker_lock:
        if _forker is None and not _forker_failed:
            try:
                _forker = Forker()
            except OSError as exc:
                _forker_failed = True
                log.warning("forking from the main file table (%s): process starts slow down with open files", exc)
        return _forker


def popen(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen` from the Forker (blocks until the child has exec'd)."""
    f = forker()
    return f.popen(argv, **kwargs) if f is not None else subprocess.Popen(argv, **kwargs)
