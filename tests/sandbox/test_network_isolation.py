"""No sandbox reaches the host's loopback, with or without internet: real listeners, real gRPC servers.

A network-enabled local sandbox has its own network namespace and user-mode networking
(slirp4netns with host loopback disabled). The host runs what a T1 machine runs on loopback: a
plain TCP listener and gRPC servers standing in for the coordinator, trainer and inference
server (T1's own server layer, health service on). From inside the sandbox every way to the
host is tried: its own 127.0.0.1, slirp's host alias 10.0.2.2, and each address of the host's
own interfaces (all local to this machine). None connects; a server the sandbox itself starts
on its loopback stays reachable from its other shells.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
from collections.abc import AsyncIterator

import pytest

from t1.config.shared import AuthConfig, ServerConfig
from t1.rpc.server import GrpcServer
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxRequest, ShellRole

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(shutil.which("slirp4netns") is None, reason="slirp4netns is not installed"),
]


def _host_addresses() -> list[str]:
    """The host's own IPv4 addresses (traffic to them stays on this machine)."""
    addrs = {"10.0.2.2", "127.0.0.1"}
    with contextlib.suppress(OSError):
        addrs.update(str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET))
    return sorted(addrs)


@pytest.fixture
async def host_services() -> AsyncIterator[dict[str, int]]:
    """A plain TCP listener and three real gRPC servers on the host's loopback."""
    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello-from-host\n")
        await writer.drain()
        writer.close()

    plain = await asyncio.start_server(greet, "127.0.0.1", 0)
    servers = {name: GrpcServer([], ServerConfig(host="127.0.0.1", port=0), AuthConfig())
               for name in ("coordinator", "trainer", "inference")}
    ports = {name: await server.start() for name, server in servers.items()}
    ports["plain"] = plain.sockets[0].getsockname()[1]
    try:
        yield ports
    finally:
        plain.close()
        for server in servers.values():
            await server.stop(0)


async def test_network_enabled_sandbox_cannot_reach_host_services(
    local_provider: LocalProvider, host_services: dict[str, int]
) -> None:
    for port in host_services.values():  # the listeners are real: the host itself reaches every one
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    box = await local_provider.create(SandboxRequest(allow_network=True))
    agent, verifier = await box.open_shell(), await box.open_shell(role=ShellRole.VERIFIER)
    targets = [(addr, port) for addr in _host_addresses() for port in host_services.values()]
    probe = "; ".join(f"timeout 3 bash -c 'exec 3<>/dev/tcp/{a}/{p}' 2>/dev/null && echo OPEN {a}:{p}"
                      for a, p in targets)
    for shell in (agent, verifier):
        result = await shell.run(probe + "; echo probed", timeout_s=120)
        assert "probed" in result.output and "OPEN" not in result.output, result.output
    own = await agent.run("nohup python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 1")
    assert own.exit_code == 0
    seen = await verifier.run("timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/8765' && echo OPEN")
    assert "OPEN" in seen.output  # the verifier reaches a server the agent started in the sandbox
    up = await agent.run("grep -c tap0: /proc/net/dev; grep nameserver /etc/resolv.conf")
    assert up.output.split() == ["1", "nameserver", "10.0.2.3"]  # the user-mode network is there, its DNS too
