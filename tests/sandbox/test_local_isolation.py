"""Local sandboxes are isolated: their own tree, their own root, no network, limits, clean destroy.

The copy-on-write root has tests of its own (test_local_overlay.py); here `overlay: false` keeps
the host's system read-only.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import AsyncIterator

import pytest

from t1.config.sandbox import LimitsConfig
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxRequest

from .conftest import provider_with

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture
async def limited_provider() -> AsyncIterator[LocalProvider]:
    async with provider_with(limits=LimitsConfig(max_processes=64, max_file_mb=1, max_memory_mb=2048)) as provider:
        yield provider


@pytest.fixture
async def readonly_provider() -> AsyncIterator[LocalProvider]:
    async with provider_with(overlay=False) as provider:
        yield provider


async def test_writes_stay_inside_the_tree_without_overlay(readonly_provider: LocalProvider) -> None:
    local_provider = readonly_provider
    box = await local_provider.create(SandboxRequest())
    shell = await box.open_shell()
    for path in ["/usr/t1-x", "/etc/t1-x", "/t1-x", "/var/t1-x"]:
        result = await shell.run(f"touch {path}")
        assert result.exit_code != 0 and "Read-only file system" in result.output, (path, result)
    ok = await shell.run("echo data > /app/a; echo log > /logs/l; echo h > ~/h; echo x > /tmp/x; id -u")
    assert ok.exit_code == 0 and ok.output.strip() == "0"
    assert (local_provider.host_path(box.id, "app") / "a").read_text() == "data\n"
    assert (local_provider.host_path(box.id, "home") / "h").read_text() == "h\n"
    assert not os.path.exists("/t1-x")


async def test_sandboxes_cannot_see_each_other(local_provider: LocalProvider) -> None:
    first = await local_provider.create(SandboxRequest())
    second = await local_provider.create(SandboxRequest())
    one, two = await first.open_shell(), await second.open_shell()
    await one.run("echo secret > /app/secret; echo tmp > /tmp/secret; sleep 300 &")
    other_root = local_provider.tree(first.id).root
    listing = await two.run("ls -A /app /tmp /root")
    assert listing.exit_code == 0 and "secret" not in listing.output
    for path in [f"{other_root}/app/secret", f"{local_provider.root}"]:
        probe = await two.run(f"ls {path}")
        assert probe.exit_code != 0 and "No such file or directory" in probe.output
    procs = await two.run("ps -eo pid,args | grep -c 'sleep 300'")
    assert procs.output.strip() == "1"  # only the grep itself: the other sandbox's PID namespace is invisible


async def test_no_network_unless_allowed(local_provider: LocalProvider) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello-from-host\n")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    probe = f"timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}; head -1 <&3'"
    try:
        closed = await (await (await local_provider.create(SandboxRequest())).open_shell()).run(probe)
        assert closed.exit_code != 0 and "hello-from-host" not in closed.output
        routes = await (await (await local_provider.create(SandboxRequest())).open_shell()).run("cat /proc/net/dev | "
                                                                                                "grep -c :")
        assert routes.output.strip() == "1"  # loopback only
        online = await (await local_provider.create(SandboxRequest(allow_network=True))).open_shell()
        opened = await online.run(probe)  # its own loopback: the host's listener is not there
        assert opened.exit_code != 0 and "hello-from-host" not in opened.output
        devices = await online.run("cat /proc/net/dev | grep -c :; grep nameserver /etc/resolv.conf")
        assert devices.output.split()[:2] == ["2", "nameserver"] and "10.0.2.3" in devices.output  # lo + tap0
    finally:
        listener.close()


async def test_resource_limits_apply(limited_provider: LocalProvider) -> None:
    shell = await (await limited_provider.create(SandboxRequest())).open_shell()
    limits = await shell.run("ulimit -f; ulimit -u; ulimit -v")
    assert limits.output.split() == ["1024", "64", str(2048 * 1024)]  # bash counts KiB
    big = await shell.run("head -c 3000000 /dev/zero > /app/big; echo rc=$?; stat -c %s /app/big")
    assert "rc=0" not in big.output and big.output.strip().endswith("1048576")


async def test_destroy_kills_processes_and_removes_the_tree(local_provider: LocalProvider) -> None:
    box = await local_provider.create(SandboxRequest())
    shell = await box.open_shell()
    await shell.run("sleep 600 & echo started")
    tree = local_provider.tree(box.id)
    assert tree.uid is not None
    alive = subprocess.run(["pgrep", "-u", str(tree.uid), "-f", "sleep 600"], capture_output=True, text=True)
    assert alive.stdout.strip(), "the sandbox process should run under the sandbox's own uid"
    await local_provider.destroy(box)
    await asyncio.sleep(0.5)
    ps = subprocess.run(["ps", "-o", "stat=,args=", "-u", str(tree.uid)], capture_output=True, text=True)
    running = [line for line in ps.stdout.splitlines() if not line.strip().startswith("Z")]  # zombies await init
    assert running == [] and not tree.root.exists()


async def test_sessions_fork_from_a_small_file_table(local_provider: LocalProvider) -> None:
    """Many open files in the server neither reach a session nor sit in the table its fork copies."""
    held = [socket.socketpair() for _ in range(500)]
    try:
        box = await local_provider.create(SandboxRequest())
        shell = await box.open_shell()
        listed = await shell.run("ls /proc/self/fd | wc -l")
        assert int(listed.output.strip()) < 10, listed  # stdio and a few of the shell's own
        result = await box.exec("echo from-exec; echo err >&2")  # type: ignore[attr-defined]
        assert result.stdout == "from-exec\n" and result.stderr == "err\n"
        thread = next(t for t in threading.enumerate() if t.name == "t1-forker")
        forker_fds = os.listdir(f"/proc/self/task/{thread.native_id}/fd")
        assert len(forker_fds) < 10 < 1000 < len(os.listdir("/proc/self/fd")), forker_fds
    finally:
        for a, b in held:
            a.close()
            b.close()
