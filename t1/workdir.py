"""A process's on-disk state: one owner per directory, and the error every storage failure raises.

DirLock: an exclusive advisory lock; a second process is refused with a clear message.

The trainer's work dir and the coordinator's run dir each hold a `.lock` file locked with
flock(2). The kernel drops the lock when its owner dies, kill -9 included, so a restart
never waits on a stale lock; a second live owner gets DirectoryBusy naming the holder.
The descriptor is close-on-exec: child processes never inherit the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from t1.errors import StorageError

LOCK_FILE = ".lock"
log = logging.getLogger(__name__)


class DirectoryBusy(StorageError):
    """Another live process owns the directory; str(self) names it and the directory."""


class DirLock:
    """`with DirLock(path, "t1-trainer"):` holds `path/.lock` exclusively until the block ends."""

    def __init__(self, directory: Path, owner: str) -> None:
        self.directory = directory
        self.owner = owner
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.directory / LOCK_FILE

    def acquire(self, wait_s: float = 0.0) -> DirLock:
        """Take the lock, waiting up to wait_s for an owner that is shutting down; else DirectoryBusy."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _describe(os.pread(fd, 4096, 0))
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise DirectoryBusy(f"{self.directory} is in use by {holder}; stop that process first, or give "
                                        f"this {self.owner} another directory") from None
                log.info("waiting up to %.0fs for %s to release %s", deadline - time.monotonic(), holder,
                         self.directory)
                time.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))
        info = json.dumps({"owner": self.owner, "pid": os.getpid(), "host": socket.gethostname(),
                           "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, info + b"\n", 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> DirLock:
        return self if self._fd is not None else self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _describe(raw: bytes) -> str:
    try:
        info = json.loads(raw.decode() or "{}")
        return f"{info['owner']} (pid {info['pid']} on {info['host']}, since {info['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process"


class SharedDirLock:
    """A lock many live processes hold at once (shared); `acquire(alone)` runs `alone()` first, under an
    exclusive lock, when no other process holds it: the moment to clean up what dead holders left."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None

    def acquire(self, alone: Callable[[], object] | None = None) -> bool:
        """Hold the lock shared; True when `alone` ran (this process was the only holder)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        ran = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        else:
            try:
                if alone is not None:
                    alone()
                    ran = True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._fd = fd
        return ran

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
