"""Aggregate limits per local sandbox: memory, processes and CPU for the whole sandbox, through cgroups.

Per-process rlimits bound one process; a sandbox runs many. Each sandbox gets a cgroup of its
own (and its verifier a sibling with the same limits, so an agent at its process limit does not
stop the verifier), under a folder unique to the provider instance (several T1 runs share a
machine). Every process of the sandbox starts inside it: `join_argv` is the first thing each
host-side command line runs, so nothing forks before it is counted. With cgroup v1 (the
`memory`, `pids` and `cpu` hierarchies) and with cgroup v2 (one unified hierarchy) the limits
are `memory` (the sandbox's processes together; at the limit the kernel kills one of them,
never a process outside the sandbox), `pids` and a CPU quota of `cpus` cores.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True, slots=True)
class CgroupLimits:
    """What the whole sandbox may use."""

    memory_mb: int
    pids: int
    cpus: float


def _own_path(controller: str | None) -> str:
    """This process's cgroup path in the hierarchy of `controller` (None: the v2 unified one)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller is None and names == "") or (controller is not None and controller in names.split(",")):
            return path.lstrip("/")
    raise FileNotFoundError(f"no {controller or 'unified'} cgroup in /proc/self/cgroup")


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _kill_members(cgroup: Path, wait_s: float = 5.0) -> None:
    """SIGKILL every process in `cgroup` and wait (bounded) until it is empty, so it can be removed."""
    procs = cgroup / "cgroup.procs"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            pids = [int(p) for p in procs.read_text().split()]
        except (OSError, ValueError):
            return
        if not pids or time.monotonic() > deadline:
            if pids:
                log.warning("cgroup %s: processes %s still alive after SIGKILL", cgroup, pids)
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


class SandboxCgroups:
    """The cgroups of one provider instance: a folder per hierarchy, a cgroup per sandbox (and its verifier)."""

    def __init__(self, bases: dict[str, Path], v2: bool) -> None:
        self.bases = bases
        """Controller (or 'unified') -> this provider's folder in that hierarchy."""
        self.v2 = v2

    @staticmethod
    def sweep(parent: Path) -> None:
        """Kill what is left in, then remove, the cgroup folders that providers of dead processes left in
        `parent` (`t1-<pid>-*`)."""
        for stale in parent.glob("t1-*-*"):
            pid = stale.name.split("-")[1]
            if not pid.isdigit() or Path(f"/proc/{pid}").exists():
                continue
            for child in stale.iterdir():
                if child.is_dir():
                    _kill_members(child)
                    with contextlib.suppress(OSError):
                        child.rmdir()
            with contextlib.suppress(OSError):
                stale.rmdir()

    @classmethod
    def create(cls, root: Path = CGROUP_ROOT) -> SandboxCgroups | None:
        """This provider's cgroup folders, or None (logged) where the machine offers no writable cgroups."""
        name = f"t1-{os.getpid()}-{secrets.token_hex(3)}"
        try:
            if (root / "cgroup.controllers").exists():
                base = root / _own_path(None) / name
                cls.sweep(base.parent)
                base.mkdir()
                _write(base / "cgroup.subtree_control", "+memory +pids +cpu")
                return cls({"unified": base}, v2=True)
            bases = {}
            for controller in V1_CONTROLLERS:
                base = root / controller / _own_path(controller) / name
                cls.sweep(base.parent)
                base.mkdir()
                bases[controller] = base
            return cls(bases, v2=False)
        except OSError as exc:
            log.warning("no per-sandbox cgroup limits (memory, pids, cpu) on this machine: %s", exc)
            return None

    def _dirs(self, name: str) -> list[Path]:
        return [base / name for base in self.bases.values()]

    def add(self, name: str, limits: CgroupLimits) -> tuple[str, ...]:
        """Make the cgroup `name` with `limits`; returns the `cgroup.procs` files a process joins it by."""
        memory = str(limits.memory_mb * 1024 * 1024)
        quota = str(max(1000, int(limits.cpus * CPU_PERIOD_US)))
        for path in self._dirs(name):
            path.mkdir(exist_ok=True)
        if self.v2:
            cg = self.bases["unified"] / name
            _write(cg / "memory.max", memory)
            with contextlib.suppress(OSError):
                _write(cg / "memory.swap.max", "0")
            _write(cg / "pids.max", str(limits.pids))
            _write(cg / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        else:
            mem = self.bases["memory"] / name
            _write(mem / "memory.limit_in_bytes", memory)
            with contextlib.suppress(OSError):  # swap accounting may be off; without swap it does not matter
                _write(mem / "memory.memsw.limit_in_bytes", memory)
            _write(self.bases["pids"] / name / "pids.max", str(limits.pids))
            cpu = self.bases["cpu"] / name
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", quota)
        return tuple(str(path / "cgroup.procs") for path in self._dirs(name))

    def memory_peak_mb(self, name: str) -> float | None:
        """Highest memory use the cgroup saw, in MiB (None where the kernel does not say)."""
        path = self.bases["unified"] / name / "memory.peak" if self.v2 else \
            self.bases["memory"] / name / "memory.max_usage_in_bytes"
        try:
            return int(path.read_text()) / (1024 * 1024)
        except (OSError, ValueError):
            return None

    def remove(self, name: str) -> None:
        """Remove the cgroup `name` (its processes must be gone)."""
        for path in self._dirs(name):
            with contextlib.suppress(OSError):
                path.rmdir()

    def close(self) -> None:
        for base in self.bases.values():
            with contextlib.suppress(OSError):
                base.rmdir()


def join_argv(procs_files: tuple[str, ...]) -> list[str]:
    """Host-side prefix that moves itself into the given cgroups, then execs the rest of the command (pure)."""
    if not procs_files:
        return []
    script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
    return ["/bin/sh", "-c", script, "t1-cgroup", *procs_files, "--"]
