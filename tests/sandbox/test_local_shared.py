"""All shells of one local sandbox share its processes and loopback network, as the shells of one VM do.

A server started in one shell answers a second shell and a terminal-mode shell of the same
sandbox, and nobody in another sandbox; processes of one shell are visible to and killable from
another; destroy kills every process of the sandbox and its namespace init.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess

import pytest

from t1.sandbox.isolation.bwrap import ROOT_CAPS
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxRequest, Shell

from .conftest import provider_with

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="the sandbox needs the system python3"),
]

PORT = 8000
SERVE = (f"echo served-by-one > /app/marker; python3 -m http.server {PORT} --bind 127.0.0.1 >/tmp/http.log 2>&1 & echo "
         "$!")
# Wait (bounded) until something listens, then fetch /marker over plain bash /dev/tcp.
FETCH = (f"for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{PORT}) 2>/dev/null && break; sleep 0.05; done; "
         f"exec 3<>/dev/tcp/127.0.0.1/{PORT} && printf 'GET /marker HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3; exec 3<&-")
PROBE = f"(exec 3<>/dev/tcp/127.0.0.1/{PORT}) && echo reached || echo refused"


async def test_server_in_one_shell_is_reachable_from_another_shell_only_in_its_sandbox(
    local_provider: LocalProvider,
) -> None:
    box = await local_provider.create(SandboxRequest())
    other = await local_provider.create(SandboxRequest())
    one, two = await box.open_shell(), await box.open_shell()
    started = await one.run(SERVE)
    assert started.exit_code == 0 and started.output.strip().isdigit(), started
    fetched = await two.run(FETCH, timeout_s=30)
    assert fetched.exit_code == 0 and "200 OK" in fetched.output and "served-by-one" in fetched.output, fetched
    term = await box.open_shell(terminal=True)
    seen = await term.run(PROBE, timeout_s=30)
    assert "reached" in seen.output.splitlines(), seen  # the terminal echoes the command line too
    stranger = await (await other.open_shell()).run(PROBE)
    assert stranger.output.splitlines()[-1] == "refused", stranger
    log = await two.run("cat /tmp/http.log")
    assert "GET /marker" in log.output  # the request reached the server of shell one


async def test_processes_of_one_shell_are_visible_and_killable_from_another(local_provider: LocalProvider) -> None:
    box = await local_provider.create(SandboxRequest())
    one, two = await box.open_shell(), await box.open_shell()
    started = await one.run("sleep 777 & echo $!")
    pid = started.output.strip()
    assert pid.isdigit(), started
    # `$!` is known once bash has forked, before the child has exec'd sleep: wait for its name (bounded).
    listed = await two.run("for i in $(seq 100); do ps -eo pid=,args= | grep '[s]leep 777' && break; sleep 0.05; done")
    assert listed.exit_code == 0 and listed.output.split()[0] == pid, listed  # same PID namespace, same numbers
    killed = await two.run(f"kill {pid}; echo rc=$?")
    assert "rc=0" in killed.output, killed
    reaped = await one.run(f"wait {pid}; echo status=$?")
    assert "status=143" in reaped.output, reaped  # 128 + SIGTERM, seen by the shell that started it
    gone = await two.run("pgrep -f 'sleep 777' || echo none")
    assert gone.output.strip() == "none", gone


async def test_destroy_kills_every_process_of_every_shell(local_provider: LocalProvider) -> None:
    box = await local_provider.create(SandboxRequest())
    tree = local_provider.tree(box.id)
    assert tree.uid is not None
    target = await local_provider.server.ns_target(tree)
    assert target is not None
    one, two = await box.open_shell(), await box.open_shell()
    await one.run("sleep 601 & echo")
    await two.run("setsid sleep 602 >/dev/null 2>&1 < /dev/null & echo")  # escapes the shell's process group
    term = await box.open_shell(terminal=True)
    await term.run("sleep 603 &")
    alive = subprocess.run(["pgrep", "-u", str(tree.uid), "-f", "sleep 60[123]"], capture_output=True, text=True)
    assert len(alive.stdout.split()) == 3, alive
    await local_provider.destroy(box)
    await asyncio.sleep(0.5)
    ps = subprocess.run(["ps", "-o", "stat=,args=", "-u", str(tree.uid)], capture_output=True, text=True)
    running = [line for line in ps.stdout.splitlines() if not line.strip().startswith("Z")]
    assert running == [], running
    assert _dead(target.pid), "the sandbox's namespace init outlived destroy"
    assert not tree.root.exists()


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for the host's init to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


async def test_closing_a_shell_keeps_the_sandbox_alive(local_provider: LocalProvider) -> None:
    box = await local_provider.create(SandboxRequest())
    one = await box.open_shell()
    await one.run("echo kept > /tmp/kept")
    await one.close()
    two = await box.open_shell()
    result = await two.run("cat /tmp/kept; ps -eo args= | grep -c '^/bin/bash --norc --noprofile -c echo "
                           "t1-sandbox-ready'")
    assert result.output.split() == ["kept", "1"], result  # one init holds the namespaces, none leaked per shell


async def test_the_init_reaps_orphans(local_provider: LocalProvider) -> None:
    shell = await (await local_provider.create(SandboxRequest())).open_shell()
    init = await shell.run("cat /proc/1/cmdline | tr '\\0' ' '")
    assert "t1-sandbox-ready" in init.output, init  # the holder itself is PID 1
    await shell.run("sh -c 'sleep 0.2 & sleep 0.3 & exit'")  # both sleeps are left to PID 1
    zombies = await shell.run("sleep 1; grep -l '^State:.Z' /proc/[0-9]*/status 2>/dev/null | wc -l")
    assert zombies.output.strip() == "0", zombies


_CAP_BITS = {"chown": 0, "dac_override": 1, "fowner": 3, "fsetid": 4, "kill": 5, "setgid": 6, "setuid": 7,
             "setpcap": 8, "net_bind_service": 10, "net_raw": 13, "sys_chroot": 18, "audit_write": 29, "setfcap": 31}
_SYS_PTRACE, _SYS_ADMIN = 19, 21


async def test_entered_sessions_hold_only_the_container_capabilities() -> None:
    async with provider_with(overlay=True) as provider:
        box = await provider.create(SandboxRequest())
        await _check_container_capabilities(await box.open_shell())


async def _check_container_capabilities(shell: Shell) -> None:
    status = await shell.run("grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs):' /proc/self/status")
    fields = dict(line.split(":\t") for line in status.output.splitlines())
    expected = f"{sum(1 << _CAP_BITS[name] for name in ROOT_CAPS):016x}"
    assert fields == {"CapPrm": expected, "CapEff": expected, "CapBnd": expected, "NoNewPrivs": "1"}, status
    assert not int(expected, 16) & (1 << _SYS_ADMIN | 1 << _SYS_PTRACE)
    mounts = await shell.run("mount -t tmpfs none /mnt 2>&1; echo rc=$?; umount /app 2>&1; echo rc=$?")
    assert mounts.output.count("rc=0") == 0, mounts
    assert (await shell.run("touch /usr/t1-x; echo rc=$?")).output.strip() == "rc=0"
    assert not os.path.exists("/usr/t1-x")


async def test_without_overlay_sessions_hold_no_privileges() -> None:
    async with provider_with(overlay=False) as provider:
        shell = await (await provider.create(SandboxRequest())).open_shell()
        status = await shell.run("grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs):' /proc/self/status")
        fields = dict(line.split(":\t") for line in status.output.splitlines())
        assert fields == {"CapPrm": "0000000000000000", "CapEff": "0000000000000000",
                          "CapBnd": "0000000000000000", "NoNewPrivs": "1"}, status
        remount = await shell.run("mount -o remount,rw / 2>&1; touch /usr/t1-x 2>&1; echo rc=$?")
        assert "rc=0" not in remount.output and not os.path.exists("/usr/t1-x"), remount
