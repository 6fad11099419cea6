"""A listening socket on the loopback of a sandbox's own network namespace, held by T1's process.

A socket belongs to the network namespace of the thread that created it. A short-lived thread
joins the sandbox's namespace (setns on /proc/PID/ns/net of the sandbox's init), creates and binds
the socket on 127.0.0.1:PORT there, and ends; the socket stays in that namespace while T1's event
loop accepts on it. So the gateway is reachable from the sandbox's processes, as a server on their
own loopback, and from nowhere else: not from the host, whose loopback is another namespace, and not
from any other sandbox. Nothing runs inside the sandbox for it, so the agent cannot replace or kill
it. Joining a namespace needs CAP_SYS_ADMIN over it (T1 running as root, as local sandboxes with
their own uids do).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Protocol, runtime_checkable

from t1.errors import InfraError
from t1.sandbox.isolation.mountns import setns

CLONE_NEWNET = 0x40000000
LOOPBACK = "127.0.0.1"


class LoopbackPortError(InfraError, RuntimeError):
    """No port could be opened inside the sandbox (no network namespace of its own, no privilege, port taken)."""


@runtime_checkable
class SandboxPorts(Protocol):
    """A provider that opens listening sockets inside its sandboxes' network namespaces."""

    async def listen_inside(self, sandbox_id: str, port: int) -> socket.socket: ...


def listen_in_namespace(ns_pid: int, port: int, backlog: int = 64) -> socket.socket:
    """A TCP socket listening on 127.0.0.1:`port` in the network namespace of process `ns_pid` (blocking)."""
    out: list[socket.socket] = []
    err: list[BaseException] = []

    def make() -> None:  # runs in a thread of its own: setns changes only the calling thread's namespace
        try:
            fd = os.open(f"/proc/{ns_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                setns(fd, CLONE_NEWNET, f"the network namespace of pid {ns_pid}")
            finally:
                os.close(fd)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((LOOPBACK, port))
                sock.listen(backlog)
            except BaseException:
                sock.close()
                raise
            out.append(sock)
        except BaseException as exc:  # handed to the caller's thread
            err.append(exc)

    thread = threading.Thread(target=make, name=f"t1-loopback-port-{ns_pid}", daemon=True)
    thread.start()
    thread.join()
    if err:
        raise LoopbackPortError(f"cannot listen on {LOOPBACK}:{port} inside the sandbox (namespace of pid "
                                 f"{ns_pid}): {err[0]}") from err[0]
    return out[0]
