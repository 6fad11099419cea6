"""Which run a sandbox belongs to, and whether that run is live: the run dir's lock.

A coordinator holds `<run_dir>/.lock` with flock(2) for as long as it lives (`t1.workdir.DirLock`);
the kernel drops it when the coordinator dies, kill -9 included, and the restarted coordinator
takes it again. So a run is named by that lock file (its path, and its inode: a run dir removed
and made again is another run) and is live while some process holds a lock on the file, which
/proc/locks shows without touching the lock. Providers whose sandboxes outlive their
coordinator label them with the run (`labels`): a sandbox reattaches only into its own run
(`matches`), and the sweep of dead owners' sandboxes spares those of a live run (`run_live`),
whose restarted coordinator reattaches them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from t1.workdir import LOCK_FILE

LABEL_RUN_LOCK = "t1.run.lock"
LABEL_RUN_INODE = "t1.run.inode"
PROC_LOCKS = Path("/proc/locks")


def lock_key(st: os.stat_result) -> str:
    """How /proc/locks names a file: `MAJOR:MINOR:INODE`, the device in hex (pure)."""
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"


def locked(path: Path, inode: str, proc_locks: Path = PROC_LOCKS) -> bool:
    """Whether `path` is still the file with `inode` and some live process holds a lock on it."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if str(st.st_ino) != inode:
        return False
    key = lock_key(st)
    with open(proc_locks) as f:
        return any(len(fields) > 5 and fields[5] == key for fields in (line.split() for line in f))


@dataclass(frozen=True, slots=True)
class RunLease:
    """One run, named by its run dir's lock file (path and inode)."""

    lock: Path
    inode: str

    @classmethod
    def of(cls, run_dir: Path) -> RunLease:
        """The run of `run_dir` (its lock file is made if the coordinator has not made it yet)."""
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = run_dir.resolve() / LOCK_FILE
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            return cls(lock, str(os.fstat(fd).st_ino))
        finally:
            os.close(fd)

    def labels(self) -> dict[str, str]:
        return {LABEL_RUN_LOCK: str(self.lock), LABEL_RUN_INODE: self.inode}

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether `labels` name this run."""
        return labels.get(LABEL_RUN_LOCK) == str(self.lock) and labels.get(LABEL_RUN_INODE) == self.inode


def run_live(labels: Mapping[str, str]) -> bool:
    """Whether the run `labels` name (`RunLease.labels`) has a live coordinator on this host; False without a run."""
    lock, inode = labels.get(LABEL_RUN_LOCK), labels.get(LABEL_RUN_INODE)
    return bool(lock and inode) and locked(Path(str(lock)), str(inode))
