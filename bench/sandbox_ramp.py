"""Sandbox creation cost as a function of how many sandboxes are already live.

Drives the load benchmark's sandbox path (bench.sandbox_host child: embedded sshd + one
bubblewrap holder per sandbox; here: real SSH connections) up to each target live count, then
times a window of creations there: each creation is what a load episode does (create, the pool's
`echo t1-ok` health check, open one framed shell). Host CPU is the sandbox host process plus every
process it starts (bwrap, nsenter, bash), kernel time included, read from a cpuacct cgroup when
one can be made (root on cgroup v1), else only the host process itself.

    .venv/bin/python bench/sandbox_ramp.py --targets 500,1000,2000,3000 --out /tmp/ramp.json

`--root both` (the default) times, at each live count, one window of read-only-system sandboxes
and one of copy-on-write roots (`t1.sandbox.isolation.rootfs`) back to back; the live population is made
of both kinds alike.

`--providers local,docker` compares providers side by side instead (`bench/provider_compare.py`):
sandbox start, command round trip, and how many live sandboxes fit, up to `--fit` (100):

    .venv/bin/python bench/sandbox_ramp.py --providers local,docker --fit 100 --out FILE
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import provider_compare
from bench.sandbox_host import HostedProvider
from t1.config.sandbox import ShellConfig
from t1.sandbox.types import Sandbox, SandboxLost, SandboxRequest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
MIN_FREE_GIB = 4.0


class HostCpu:
    """CPU seconds of the sandbox host and its descendants (cgroup) and of its own process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.group: Path | None = None
        if CPUACCT.is_dir() and os.access(CPUACCT, os.W_OK):
            group = CPUACCT / f"t1-sandbox-ramp-{os.getpid()}"
            with contextlib.suppress(OSError):
                group.mkdir()
                (group / "cgroup.procs").write_text(str(pid))
                self.group = group

    def total(self) -> float:
        if self.group is None:
            return self.own()
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    def own(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def by_command(self) -> dict[str, float]:
        """CPU seconds so far of the live processes in the group, summed by command name."""
        if self.group is None:
            return {}
        tick = os.sysconf("SC_CLK_TCK")
        totals: dict[str, float] = {}
        for pid in (self.group / "cgroup.procs").read_text().split():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            totals[comm] = totals.get(comm, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        return totals

    def close(self) -> None:
        if self.group is None:
            return
        parent = self.group.parent / "cgroup.procs"
        for pid in (self.group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                parent.write_text(pid)
        with contextlib.suppress(OSError):
            self.group.rmdir()


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def system_tasks() -> int:
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


def pid_room(needed_sandboxes: int, tasks_per_sandbox: int = 8) -> bool:
    """Whether the host has pids left for that many more sandboxes (pid_max is shared with everyone)."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return system_tasks() + needed_sandboxes * tasks_per_sandbox < 0.9 * pid_max


def mountinfo_lines(pid: int) -> int:
    try:
        return len(Path(f"/proc/{pid}/mountinfo").read_text().splitlines())
    except OSError:
        return -1


CREATE_TRIES = 3
"""As the sandbox pool does (`pool.create_retries`): a create that fails (an SSH connect timing out
on an overloaded host) is tried again; `failed_creates` counts those."""
failed_creates = 0


async def provision(provider: HostedProvider, live: list[Sandbox], overlay: bool) -> None:
    global failed_creates
    for attempt in range(CREATE_TRIES):
        try:
            sandbox = await provider.create(SandboxRequest(), overlay=overlay)
            break
        except SandboxLost:
            failed_creates += 1
            if attempt == CREATE_TRIES - 1:
                raise
    live.append(sandbox)
    result = await sandbox.exec("echo t1-ok", timeout_s=120)  # type: ignore[attr-defined]
    if "t1-ok" not in str(result.stdout):
        raise RuntimeError(f"health check of {sandbox.id} failed: {result}")
    await sandbox.open_shell()


async def create_many(provider: HostedProvider, live: list[Sandbox], count: int, concurrency: int,
                      kinds: tuple[bool, ...]) -> None:
    """`count` sandboxes, `concurrency` at a time, their roots cycling through `kinds` (overlay or not)."""
    sem = asyncio.Semaphore(concurrency)

    async def one(overlay: bool) -> None:
        async with sem:
            await provision(provider, live, overlay)

    async with asyncio.TaskGroup() as tg:
        for i in range(count):
            tg.create_task(one(kinds[i % len(kinds)]))


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="t1-ramp-"))
    root.chmod(0o711)  # per-sandbox uids reach their trees
    provider = HostedProvider(root / "trees", ShellConfig(), log_file=root / "host.log")
    await provider.start()
    cpu = HostCpu(provider.pid)
    live: list[Sandbox] = []
    rows: list[dict[str, Any]] = []
    try:
        for target in args.targets:
            if mem_available_gib() < MIN_FREE_GIB:
                print(f"stopping: under {MIN_FREE_GIB} GiB available", file=sys.stderr)
                break
            if not pid_room(target + args.window - len(live)):
                print(f"stopping before {target}: too few pids left on this host", file=sys.stderr)
                break
            await create_many(provider, live, max(0, target - len(live)), args.concurrency, args.kinds)
            for overlay in args.kinds:  # side by side at the same live count
                rows.append(await window(provider, cpu, live, target, overlay, args))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        t_close = time.monotonic()
        await provider.close()
        cpu.close()
        print(f"closed {len(live)} sandboxes in {time.monotonic() - t_close:.1f}s", file=sys.stderr)
    return rows


async def window(provider: HostedProvider, cpu: HostCpu, live: list[Sandbox], target: int, overlay: bool,
                 args: argparse.Namespace) -> dict[str, Any]:
    """Time `args.window` creations of one kind at `target` live sandboxes, then the idle cost."""
    comm0 = cpu.by_command()
    host0, own0, client0, t0 = cpu.total(), cpu.own(), time.process_time(), time.monotonic()
    await create_many(provider, live, args.window, args.concurrency, (overlay,))
    wall = time.monotonic() - t0
    host1, own1, client1 = cpu.total(), cpu.own(), time.process_time()
    comm1 = cpu.by_command()
    n = args.window
    row = {"live": target, "root": "overlay" if overlay else "readonly", "window": n,
           "creates_per_s": round(n / wall, 1),
           "host_cpu_ms_per_create": round((host1 - host0) / n * 1e3, 2),
           "host_proc_cpu_ms_per_create": round((own1 - own0) / n * 1e3, 2),
           "client_cpu_ms_per_create": round((client1 - client0) / n * 1e3, 2),
           "live_processes_ms_per_create": {c: round((v - comm0.get(c, 0.0)) / n * 1e3, 2)
                                            for c, v in sorted(comm1.items())},
           "host_processes": sum(1 for _ in (cpu.group / "cgroup.procs").read_text().split())
           if cpu.group is not None else None,
           "host_fds": len(os.listdir(f"/proc/{provider.pid}/fd")),
           "host_mountinfo_lines": mountinfo_lines(provider.pid),
           "mem_available_gib": round(mem_available_gib(), 1), "cgroup": cpu.group is not None,
           "failed_creates_so_far": failed_creates, "load_avg_1m": round(os.getloadavg()[0], 1)}
    if args.idle_s > 0:  # what the live sandboxes cost while nothing is created
        host0, client0 = cpu.total(), time.process_time()
        await asyncio.sleep(args.idle_s)
        row["idle_host_cpu_pct"] = round((cpu.total() - host0) / args.idle_s * 100, 1)
        row["idle_client_cpu_pct"] = round((time.process_time() - client0) / args.idle_s * 100, 1)
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--targets", default="500,1000,2000,3000",
                   type=lambda s: [int(x) for x in s.split(",")], help="live counts to measure at")
    p.add_argument("--window", type=int, default=100, help="creations timed at each live count")
    p.add_argument("--concurrency", type=int, default=8, help="creations in flight")
    p.add_argument("--idle-s", type=float, default=5.0, help="after each window, measure idle CPU this long")
    p.add_argument("--root", choices=["readonly", "overlay", "both"], default="both",
                   help="sandbox roots: the read-only system, the copy-on-write overlay, or both side by side")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    p.add_argument("--providers", type=lambda s: s.split(","), default=None,
                   help="compare these providers side by side (local,docker) instead of the ramp")
    provider_compare.add_arguments(p)
    args = p.parse_args(argv)
    if args.providers is not None:
        report = provider_compare.compare(args)
        provider_compare.print_table(report)
        if args.out is not None:
            args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        return
    args.kinds = {"readonly": (False,), "overlay": (True,), "both": (False, True)}[args.root]
    rows = asyncio.run(run(args))
    print(f"{'live':>6} {'root':>9} {'creates/s':>10} {'host ms/create':>15} {'host proc ms':>13} {'client ms':>10} "
          f"{'idle host %':>12} {'idle client %':>14}")
    for r in rows:
        print(f"{r['live']:>6} {r['root']:>9} {r['creates_per_s']:>10} {r['host_cpu_ms_per_create']:>15} "
              f"{r['host_proc_cpu_ms_per_create']:>13} {r['client_cpu_ms_per_create']:>10} "
              f"{r.get('idle_host_cpu_pct', '-'):>12} {r.get('idle_client_cpu_pct', '-'):>14}")
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
