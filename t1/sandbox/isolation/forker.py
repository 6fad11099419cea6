"""Process starts from a thread with its own, nearly empty file table and every signal blocked.

A fork copies the forking task's file table and the child then closes every inherited
descriptor; the local sandbox server holds a socket and three pipes per live sandbox, so forking
from its table made each process start cost time in proportion to the number of live sandboxes
(0.74 ms with 100 open files, 3-4 ms with 16,000). `popen` starts processes from the `Forker`
thread instead, with `posix_spawn`.

That thread must never run a signal handler. Handlers name descriptors by number: libuv's
SIGCHLD handler takes a lock by reading a pipe, CPython's writes to the loop's wakeup fd. Run on
this thread, those numbers mean other files (or none), and the lock read blocked the thread, and
with it every later process start, for good. So the thread blocks every signal, and each child
gets an empty signal mask from `posix_spawn` instead of inheriting that one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import IO, Any

from t1.sandbox.isolation.mountns import CLONE_NEWNS, setns

_CLONE_FILES = 0x400
_CLONE_FS = 0x200
_STDIO = ("stdin", "stdout", "stderr")
_RESTORED_SIGNALS = tuple(sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}))
"""Back to their defaults in every child. CPython ignores SIGPIPE and SIGXFSZ (`subprocess`'s
`restore_signals` resets those two), and a process started in the background by a shell without
job control ignores SIGINT and SIGQUIT: a sandbox's commands inherited that, so an interrupt on
timeout (and Ctrl-C in a terminal) did nothing until the kill."""

log = logging.getLogger(__name__)


class Child:
    """A process `popen` started: the part of `subprocess.Popen` the sandbox code uses."""

    def __init__(self, pid: int, argv: list[str], pipes: Mapping[str, IO[bytes]]) -> None:
        self.pid = pid
        self.args = argv
        self.returncode: int | None = None
        self.stdin: IO[bytes] | None = pipes.get("stdin")
        self.stdout: IO[bytes] | None = pipes.get("stdout")
        self.stderr: IO[bytes] | None = pipes.get("stderr")

    def poll(self) -> int | None:
        """The exit status if the process has ended (reaping it), else None."""
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self) -> int:
        """Block until the process ends; its exit status (-N: killed by signal N)."""
        while self.returncode is None:
            self._reap(0)
        return self.returncode

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped elsewhere; its status is lost
            self.returncode = 255
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __repr__(self) -> str:
        return f"Child(pid={self.pid}, args={self.args[:1]}, returncode={self.returncode})"


@dataclass(frozen=True, slots=True)
class _Job:
    path: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    setsid: bool
    targets: tuple[int, ...]
    """Per received descriptor, the number the child finds it at: 0-2 for stdio, or its pass_fds number."""
    devnull: tuple[int, ...]
    """Stdio numbers opened on /dev/null in the child."""
    mount_ns: bool = False
    """The last received descriptor is a mount namespace the child starts in (not passed to it)."""


class Forker:
    """Starts processes from a thread whose file table holds only stdio and one socket.

    The descriptors a child gets (its ends of new pipes, a PTY slave, an info pipe) go to that
    thread over the socket (SCM_RIGHTS); the caller keeps the other ends of the pipes. Children
    stay children of this process (waits, pidfds and process groups are unchanged), and since the
    thread never exits, `PR_SET_PDEATHSIG` (bubblewrap's `--die-with-parent`) fires only when the
    process dies. The thread also has its own cwd, set per start. The cyclic GC is off while it
    runs Python code: a finalizer run there would close a number in the wrong file table.
    """

    def __init__(self) -> None:
        self._ours, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._jobs: queue.SimpleQueue[tuple[_Job, int, list[int | BaseException], threading.Event]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        started: Future[int] = Future()
        threading.Thread(target=self._run, args=(started,), name="t1-forker", daemon=True).start()
        self.native_id = started.result()

    def popen(
        self, argv: list[str], *, stdin: int | None = None, stdout: int | None = None, stderr: int | None = None,
        env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
        start_new_session: bool = False, pass_fds: Iterable[int] = (), mount_ns: int | None = None,
    ) -> Child:
        """Start `argv` as `subprocess.Popen` would with these arguments (blocks; call it off the loop).

        stdin/stdout/stderr: None (this process's own), `subprocess.PIPE`, `subprocess.DEVNULL` or
        a descriptor. `pass_fds` keep their numbers in the child. `mount_ns`: a descriptor of the
        mount namespace the child starts in (a sandbox's, `t1.sandbox.isolation.mountns`) instead of ours.
        """
        env = dict(os.environ if env is None else env)
        path = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH", os.defpath))
        if path is None:
            raise FileNotFoundError(errno.ENOENT, f"{argv[0]!r} not found on PATH", argv[0])
        send: list[int] = []
        targets: list[int] = []
        devnull: list[int] = []
        ours: dict[str, int] = {}
        child_ends: list[int] = []
        try:
            for number, (name, spec) in enumerate(zip(_STDIO, (stdin, stdout, stderr), strict=True)):
                if spec == subprocess.PIPE:
                    read, write = os.pipe()
                    child_end, ours[name] = (read, write) if number == 0 else (write, read)
                    child_ends.append(child_end)
                    send.append(child_end)
                    targets.append(number)
                elif spec == subprocess.DEVNULL:
                    devnull.append(number)
                elif spec is not None:
                    if spec < 0:
                        raise ValueError(f"{name}={spec}: not a descriptor")
                    send.append(spec)
                    targets.append(number)
            for fd in pass_fds:
                send.append(fd)
                targets.append(fd)
            if mount_ns is not None:
                send.append(mount_ns)
            job = _Job(path, list(argv), env, os.fspath(cwd) if cwd is not None else os.getcwd(),
                       start_new_session, tuple(targets), tuple(devnull), mount_ns is not None)
            slot: list[int | BaseException] = []
            done = threading.Event()
            with self._lock:  # one exchange on the socket at a time
                if send:
                    socket.send_fds(self._ours, [b"fds"], send)
                self._jobs.put((job, len(send), slot, done))
                done.wait()
            result = slot.pop()
            if isinstance(result, BaseException):
                raise result
        except BaseException:
            for fd in ours.values():
                os.close(fd)
            raise
        finally:
            for fd in child_ends:
                os.close(fd)
        pipes = {name: os.fdopen(fd, "wb" if name == "stdin" else "rb") for name, fd in ours.items()}
        return Child(result, list(argv), pipes)

    def _run(self, started: Future[int]) -> None:
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_FILES | _CLONE_FS) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_FILES | CLONE_FS)")
            keep = self._theirs.fileno()
            os.closerange(3, keep)  # only in this thread's copy of the table
            os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
            self._host_ns = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            started.set_exception(exc)
            return
        started.set_result(threading.get_native_id())
        while True:
            job, num_fds, slot, done = self._jobs.get()
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                slot.append(self._spawn(job, num_fds))
            except BaseException as exc:  # handed to the caller, which raises it
                slot.append(exc)
            finally:
                if gc_was_enabled:
                    gc.enable()
            # Nothing here may hold the job once the caller runs: an object freed in this thread
            # closes its descriptor in this thread's file table, not the process's.
            del job, slot
            done.set()

    def _spawn(self, job: _Job, num_fds: int) -> int:
        received: list[int] = []
        mount_ns: int | None = None
        try:
            if num_fds:
                _, received, _, _ = socket.recv_fds(self._theirs, 16, num_fds)
                if len(received) != num_fds:  # the kernel drops what does not fit in the table
                    raise OSError(errno.EMFILE, f"no room for the descriptors of {job.argv[0]!r} in the forker's table")
            if job.mount_ns:
                mount_ns = received.pop()
                os.set_inheritable(mount_ns, False)
            numbers = list(job.targets)
            # Dup every received descriptor to the number the child expects. A source must not sit
            # on a number that an earlier dup overwrites, so move those out of the way first; and
            # no source may stay open in the child at its own number.
            received = [_dup_away(fd, numbers) if fd in numbers else fd for fd in received]
            for fd in received:
                os.set_inheritable(fd, False)
            actions: list[tuple[Any, ...]] = [
                (os.POSIX_SPAWN_DUP2, fd, n) for fd, n in zip(received, numbers, strict=True)
            ]
            actions += [(os.POSIX_SPAWN_OPEN, n, os.devnull, os.O_RDWR, 0) for n in job.devnull]
            if mount_ns is not None:
                setns(mount_ns, CLONE_NEWNS, f"the mount namespace of {job.argv[0]!r}")
            try:
                os.chdir(job.cwd)  # this thread's own cwd (CLONE_FS); the child starts there
                return os.posix_spawn(job.path, job.argv, job.env, file_actions=actions, setsid=job.setsid,
                                      setsigmask=(), setsigdef=_RESTORED_SIGNALS)
            finally:
                if mount_ns is not None:
                    setns(self._host_ns, CLONE_NEWNS, "the host's mount namespace")
        finally:
            if mount_ns is not None:
                received.append(mount_ns)
            for fd in received:
                with contextlib.suppress(OSError):
                    os.close(fd)


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
_forker_lock = threading.Lock()


def forker() -> Forker:
    """The process's Forker, started on first use."""
    global _forker
    with _forker_lock:
        if _forker is None:
            _forker = Forker()
        return _forker


def popen(argv: list[str], **kwargs: Any) -> Child:
    """`Forker.popen` on the process's Forker (blocks until the child has exec'd)."""
    return forker().popen(argv, **kwargs)
