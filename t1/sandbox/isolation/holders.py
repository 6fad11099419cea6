"""Sandbox holders live no longer than the T1 process that started them; what a dead run left is killed.

Each local sandbox's PID 1 (the holder, `t1.sandbox.isolation.bwrap.HOLDER_SCRIPT`) blocks reading the read
end of this process's lifeline pipe. The write end is opened once, never written and never closed
by T1: the kernel closes it when the process ends, however it ends (kill -9 included), the holder
reads end-of-file and exits, and with PID 1 gone the kernel kills every process of its PID
namespace. A pipe survives what a parent-death signal does not: it crosses bubblewrap's PID
namespace and the uid changes on the way (`setpriv`, bwrap's own), which clear that signal, and
it has no window before it is armed. A fork of this process closes its copy of the write end, so
only this process keeps the holders alive.

One case remains for the start-up sweep (`kill_leftovers`): a run killed while bubblewrap waited
for T1 to write its sandbox's uid maps leaves bubblewrap's child blocked before it ever runs the
holder. Every process started for a tree names the tree in its arguments (bubblewrap's binds,
the holder's marker argument), so the first provider on a sandbox root, while no other run uses
it, finds them by that and kills them before it removes the trees.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

HOLDER_NAME = "t1-sandbox-holder"
"""The holder's `$0`; its one argument is its tree's host path."""

KILL_WAIT_S = 5.0

_lock = threading.Lock()
_pipe: tuple[int, int] | None = None


def _drop_write_end_in_child() -> None:
    global _pipe
    if _pipe is not None:
        with contextlib.suppress(OSError):
            os.close(_pipe[1])
        with contextlib.suppress(OSError):
            os.close(_pipe[0])
        _pipe = None


os.register_at_fork(after_in_child=_drop_write_end_in_child)


def lifeline_fd() -> int:
    """The read end of this process's lifeline pipe, for holders to inherit (`pass_fds`); made on first use."""
    global _pipe
    with _lock:
        if _pipe is None:
            _pipe = os.pipe()  # both ends close-on-exec: only a holder started with pass_fds gets the read end
        return _pipe[0]


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie. A killed process is still running while the kernel tears it
    down (its namespaces, its mounts: long under load), and its cmdline already reads empty then."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):  # gone
        return False


def _names_tree(pid: int, prefix: bytes) -> bool:
    """Whether `pid` is alive (not a zombie) and an argument of its starts with `prefix`."""
    try:
        if not _running(pid):
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return any(arg.startswith(prefix) for arg in cmdline.read().split(b"\0"))
    except (OSError, IndexError):  # gone meanwhile
        return False


def _prefix(root: Path) -> bytes:
    return f"{root}/sb-".encode()


def tree_processes(root: Path) -> list[int]:
    """Live processes started for sandbox trees under `root`: an argument of theirs starts with `root/sb-`."""
    prefix = _prefix(root)
    me = os.getpid()
    return [int(e.name) for e in os.scandir("/proc")
            if e.name.isdigit() and int(e.name) != me and _names_tree(int(e.name), prefix)]


def kill_leftovers(root: Path) -> int:
    """SIGKILL every process started for a tree under `root` and wait (bounded) until they have exited (zombies
    or reaped, not only nameless); how many.

    Call only while no live provider uses `root` (every such process is then a dead run's).
    """
    pids = tree_processes(root)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while (alive := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pids:
        log.warning("killed %d sandbox processes left in %s by a run that did not stop cleanly%s", len(pids), root,
                    f" ({len(alive)} still alive after {KILL_WAIT_S:.0f}s: {alive})" if alive else "")
    return len(pids)
