"""Aggregate limits per local sandbox (cgroups): processes of one sandbox share its memory, processes and CPU.

Per-process limits would let two 180 MiB processes live side by side in a 256 MiB sandbox; the
sandbox's cgroup does not. The host's processes (this test's own, which allocates as much) are
untouched, and the limits come from the task's request (memory_mb, cpus) or the config's defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from t1.config.sandbox import LimitsConfig, LocalProviderConfig
from t1.sandbox.isolation.cgroups import SandboxCgroups
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxRequest, ShellRole

from .conftest import SHELL_CFG, sandbox_tmp_root

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="per-sandbox cgroups need root"),
]

HOG = "python3 -c 'import time; b = b\"x\" * (180 << 20); time.sleep(4); print(\"al\" + \"ive\")'"


async def test_two_processes_cannot_exceed_the_sandbox_memory(local_provider: LocalProvider) -> None:
    box = await local_provider.create(SandboxRequest(memory_mb=256, cpus=0.5))
    assert local_provider.cgroups is not None, "this machine offers cgroups; the provider must use them"
    tree = local_provider.tree(box.id)
    assert tree.cgroup_procs and all(Path(p).exists() for p in tree.cgroup_procs)
    shell = await box.open_shell()
    assert all(Path(p).read_text().split() for p in tree.cgroup_procs)  # the init and the shell are inside
    result = await shell.run(f"{HOG} & {HOG} & wait; echo done", timeout_s=60)
    assert "done" in result.output and result.output.split().count("alive") == 1, result.output  # one was OOM-killed
    peak = local_provider.cgroups.memory_peak_mb(box.id)
    assert peak is not None and peak <= 256.5
    host = b"x" * (180 << 20)  # the host (this process) is not limited by the sandbox
    assert len(host) == 180 << 20
    quota = Path(next(p for p in tree.cgroup_procs if "/cpu/" in p or "unified" in p)).parent
    if (quota / "cpu.cfs_quota_us").exists():
        assert (quota / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert not any(Path(p).read_text().split() for p in tree.verifier_cgroup_procs)
    verifier = await box.open_shell(role=ShellRole.VERIFIER)
    assert (await verifier.run("echo hi")).output.strip() == "hi"
    assert all(Path(p).read_text().split() for p in tree.verifier_cgroup_procs)  # its own cgroup, same limits
    await local_provider.destroy(box)
    assert not any(Path(p).parent.exists() for p in tree.cgroup_procs)  # removed with the sandbox


@pytest.fixture
async def small_provider() -> AsyncIterator[LocalProvider]:
    root = sandbox_tmp_root()
    cfg = LocalProviderConfig(root=root / "trees", limits=LimitsConfig(max_processes=64))
    provider = LocalProvider(cfg, SHELL_CFG)
    try:
        yield provider
    finally:
        await provider.close()
        shutil.rmtree(root, ignore_errors=True)


async def test_a_fork_bomb_stops_at_the_sandbox_process_limit(small_provider: LocalProvider) -> None:
    box = await small_provider.create(SandboxRequest())
    shell = await box.open_shell()
    tree = small_provider.tree(box.id)
    pids = next(Path(p).parent for p in tree.cgroup_procs if "/pids/" in p or "unified" in p)
    assert (pids / "pids.max").read_text().strip() == str(tree.limits.max_processes)
    bomb = await shell.run("nohup setsid bash -c 'for i in $(seq 2000); do sleep 60 & done' >/dev/null 2>&1 & sleep 5")
    assert bomb.exit_code is not None or bomb.shell_restarted  # the agent's shell may itself fail to fork
    limit, current = tree.limits.max_processes, 0
    for _ in range(120):  # the bomb forks as fast as a loaded machine lets it
        current = int((pids / "pids.current").read_text())
        assert current <= limit
        if current >= limit - 2:
            break
        await asyncio.sleep(0.5)
    assert current >= limit - 2, current
    verifier = await box.open_shell(role=ShellRole.VERIFIER)  # the verifier has a cgroup of its own
    assert (await verifier.run("echo verifier-runs")).output.strip() == "verifier-runs"


def test_a_dead_providers_cgroups_are_emptied_then_removed() -> None:
    """What a provider killed with kill -9 left in its cgroups is killed by the next provider's start."""
    mine = SandboxCgroups.create()
    if mine is None:
        pytest.skip("no writable cgroups here")
    parents = [base.parent for base in mine.bases.values()]
    mine.close()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that was a process: the dead provider's
    stale = [parent / f"t1-{gone.pid}-0000aa" / "sb-left" for parent in parents]
    sleeper = subprocess.Popen(["sleep", "3600"])
    try:
        for cgroup in stale:
            cgroup.mkdir(parents=True)
            (cgroup / "cgroup.procs").write_text(str(sleeper.pid))
        again = SandboxCgroups.create()
        assert again is not None
        again.close()
        assert sleeper.wait(5) == -9, "the process left in the dead provider's cgroup is killed"
        assert not any(c.parent.exists() for c in stale), "and its cgroup folders removed"
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        for cgroup in stale:
            for d in (cgroup, cgroup.parent):
                with contextlib.suppress(OSError):
                    d.rmdir()
