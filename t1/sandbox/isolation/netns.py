"""Networking of local sandboxes: a network namespace of their own always, user-mode internet when allowed.

Every local sandbox gets its own network namespace (`--unshare-net`): without internet it has
only its own loopback, so its processes see one another's servers and nothing of the host's.
A task that allows internet gets it through slirp4netns: a user-mode TCP/IP stack running on
the host (sandboxed, see `slirp_argv`), joined to the sandbox's namespaces, forwarding its traffic
through ordinary host sockets. It is started with `--disable-host-loopback`, so 10.0.2.2 (the
host as slirp shows it) does not lead to the host's loopback, and the sandbox's own 127.0.0.1
is its own: no listener on the host's loopback (T1's coordinator, trainer and inference
servers, anything else) can be reached from a sandbox, with or without internet. DNS inside goes
to slirp's forwarder at 10.0.2.3 through a resolv.conf of the sandbox's own.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

from t1.errors import InfraError
from t1.sandbox.isolation.forker import Child, popen
from t1.sandbox.isolation.holders import lifeline_fd

SLIRP = "slirp4netns"
SLIRP_READY_TIMEOUT_S = 10.0
RESOLV_CONF = "nameserver 10.0.2.3\n"
RESOLV_FILE = "resolv.conf"
"""In the sandbox's tree: the resolv.conf bound over /etc/resolv.conf of a network-enabled sandbox."""


class NetworkSetupError(InfraError, RuntimeError):
    """User-mode networking could not be started for a sandbox that allows internet."""


NETWORK_NAMESPACE = ["--unshare-net"]
"""bubblewrap's flag for the sandbox's own network namespace: every sandbox, internet or not."""


def network_binds(root: Path, allow_network: bool) -> list[str]:
    """bubblewrap mounts for the sandbox's network, after the system's (pure): its resolv.conf."""
    return ["--ro-bind", str(root / RESOLV_FILE), "/etc/resolv.conf"] if allow_network else []


def write_resolv_conf(root: Path) -> None:
    (root / RESOLV_FILE).write_text(RESOLV_CONF)
    os.chmod(root / RESOLV_FILE, 0o644)


def slirp_argv(ns_pid: int, ready_fd: int, exit_fd: int) -> list[str]:
    """slirp4netns for the namespaces of `ns_pid` (pure).

    It runs as T1's user: opening /dev/net/tun needs it; `--enable-sandbox` then drops every
    capability but CAP_NET_BIND_SERVICE and confines it to a mount namespace of its own, and
    `--enable-seccomp` limits its system calls, before it handles a packet. It exits when
    `exit_fd` hangs up: T1's lifeline (`t1.sandbox.isolation.holders`), so it ends with T1's process as the
    sandbox does (it runs on the host, outside the sandbox's PID namespace).
    """
    if shutil.which(SLIRP) is None:
        raise NetworkSetupError(f"{SLIRP} is not installed; a task that allows internet needs it (scripts/setup.sh)")
    return [
        SLIRP,
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        "--enable-sandbox",
        "--enable-seccomp",
        f"--userns-path=/proc/{ns_pid}/ns/user",
        f"--ready-fd={ready_fd}",
        f"--exit-fd={exit_fd}",
        str(ns_pid),
        "tap0",
    ]


def start_slirp(sandbox_id: str, ns_pid: int) -> Child:
    """Start slirp4netns for a sandbox and return once its interface is up (blocking: call off the loop)."""
    ready_r, ready_w = os.pipe()
    try:
        lifeline = lifeline_fd()
        proc = popen(slirp_argv(ns_pid, ready_w, lifeline), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.PIPE, pass_fds=(ready_w, lifeline), env={"PATH": "/usr/bin:/bin"},
                     start_new_session=True)
    finally:
        os.close(ready_w)
    try:
        deadline = time.monotonic() + SLIRP_READY_TIMEOUT_S
        ready = b""
        while not ready and time.monotonic() < deadline:
            readable, _, _ = select.select([ready_r], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                break
            ready = os.read(ready_r, 16) or b"closed"
    finally:
        os.close(ready_r)
    if ready != b"1":
        stop_slirp(proc)
        assert proc.stderr is not None
        err = proc.stderr.read().decode(errors="replace").strip()
        raise NetworkSetupError(f"sandbox {sandbox_id}: {SLIRP} did not come up: {err or 'timed out'}")
    assert proc.stderr is not None
    proc.stderr.close()
    return proc


def stop_slirp(proc: Child) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
