"""The coordinator's side of the local sandbox service (`t1.sandbox.local.service`): find or start it, attach, ask.

`start()` connects to `<run_dir>/sandbox-service.sock`; when nothing answers there (a first start,
or the service died) it starts `python -m t1.sandbox.local.service` in a session of its own, so that
neither the coordinator's death nor a signal to its process group reaches it, with its config in
`<run_dir>/sandbox-service.json` and its output in `<run_dir>/logs/sandbox-service.log`, and
waits for the socket (`spawn_service` starts it ahead, while the coordinator starts). Then it attaches, which holds off
the service's orphan timer for as long as
this connection is open. A request whose service has gone (its connection closed) raises
SandboxLost; the next `start()` starts a new service, whose start sweeps what the dead one left.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncssh

from t1.config.sandbox import LocalProviderConfig
from t1.errors import InfraError
from t1.sandbox.isolation.bwrap import NamespaceTarget
from t1.sandbox.local.local_host import SshAccess
from t1.sandbox.local.service import ServiceConfig
from t1.sandbox.local.service_wire import (
    MAX_LINE,
    answers,
    read_message,
    request_to_json,
    unix_path,
    write_message,
)
from t1.sandbox.types import SandboxGone, SandboxLost, SandboxRequest

log = logging.getLogger(__name__)

SOCKET_NAME = "sandbox-service.sock"
CONFIG_NAME = "sandbox-service.json"
LOG_NAME = "sandbox-service.log"
START_TIMEOUT_S = 120.0


class ServiceFailed(InfraError, RuntimeError):
    """The sandbox service could not be started or reached; the message says why and where its log is."""


def _tail(path: Path, limit: int = 2000) -> str:
    with contextlib.suppress(OSError):
        return path.read_bytes()[-limit:].decode(errors="replace").strip()
    return ""


_SPAWNED: dict[Path, subprocess.Popen[bytes]] = {}
"""The services this process started, by socket (reaped when they end: `spawn_service`, `ServiceClient.close`)."""


def spawn_service(cfg: LocalProviderConfig, run_dir: Path) -> None:
    """Start the run's sandbox service, detached from this process, unless one serves or is starting (blocking,
    returns at once): the coordinator calls it first thing, so the service's start overlaps its own."""
    run_dir = run_dir.resolve()
    socket = run_dir / SOCKET_NAME
    proc = _SPAWNED.get(socket)
    if (proc is not None and proc.poll() is None) or answers(socket):
        return
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    config = run_dir / CONFIG_NAME
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with open(fd, "w") as f:
        local = cfg.model_copy(update={"root": cfg.root.resolve()})  # not one relative to the service's cwd
        f.write(ServiceConfig(local, socket, cfg.service_grace_s).to_json())
    with open(logs / LOG_NAME, "ab") as out:
        _SPAWNED[socket] = proc = subprocess.Popen([sys.executable, "-m", "t1.sandbox.local.service", str(config)],
                                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                                   start_new_session=True, close_fds=True)
    log.info("started the sandbox service (pid %d) for %s", proc.pid, run_dir)


class ServiceClient:
    """One attached connection to the run's sandbox service; the local provider's backend with a run dir."""

    def __init__(self, cfg: LocalProviderConfig, run_dir: Path) -> None:
        self.cfg = cfg
        self.run_dir = run_dir.resolve()
        self.socket = self.run_dir / SOCKET_NAME
        self.pid: int | None = None
        """The service's pid (from `attach`)."""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._pump: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._access: SshAccess | None = None

    @property
    def connected(self) -> bool:
        return self._pump is not None and not self._pump.done()

    async def start(self) -> SshAccess:
        """Attached to the run's service (started if none answers); its SSH server's address and keys."""
        async with self._lock:
            if self.connected and self._access is not None:
                return self._access
            if not await self._connect():
                await asyncio.to_thread(spawn_service, self.cfg, self.run_dir)
                deadline = time.monotonic() + START_TIMEOUT_S
                while not await self._connect():
                    proc = _SPAWNED.get(self.socket)
                    if proc is not None and proc.poll() is not None:
                        raise ServiceFailed(f"the sandbox service exited with {proc.returncode} before it "
                                            f"served: {_tail(self.run_dir / 'logs' / LOG_NAME)}")
                    if time.monotonic() > deadline:
                        raise ServiceFailed(f"the sandbox service did not open {self.socket} within "
                                            f"{START_TIMEOUT_S:.0f}s (log: {self.run_dir / 'logs' / LOG_NAME})")
                    await asyncio.sleep(0.02)
            reply = await self.call("attach")
            self.pid = int(reply["pid"])
            self._access = SshAccess(str(reply["host"]), int(reply["port"]),
                                     asyncssh.import_private_key(reply["client_key"]),
                                     asyncssh.import_public_key(reply["host_key"]))
            return self._access

    async def _connect(self) -> bool:
        try:
            with unix_path(self.socket) as path:
                self._reader, self._writer = await asyncio.open_unix_connection(path, limit=MAX_LINE)
        except (FileNotFoundError, ConnectionRefusedError):
            return False
        self._pump = asyncio.ensure_future(self._read_replies(self._reader))
        return True

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        try:
            while (message := await read_message(reader)) is not None:
                future = self._pending.pop(int(message.get("id") or 0), None)
                if future is not None and not future.done():
                    future.set_result(message)
        except (ConnectionError, ValueError) as exc:
            log.warning("sandbox service connection: %s", exc)
        finally:
            lost = SandboxLost(f"the sandbox service (pid {self.pid}) is gone: its control connection closed")
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(lost)
            self._pending.clear()

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        """One request and its reply; SandboxGone/SandboxLost or RuntimeError naming the service's error."""
        if not self.connected or self._writer is None:
            raise SandboxLost(f"the sandbox service (pid {self.pid}) is gone: not connected")
        request_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await write_message(self._writer, {"id": request_id, "op": op, **args})
        except ConnectionError as exc:
            self._pending.pop(request_id, None)
            raise SandboxLost(f"the sandbox service (pid {self.pid}) is gone: {exc}") from exc
        reply = await future
        if not reply.get("ok"):
            error = str(reply.get("error"))
            raise SandboxGone(error) if reply.get("gone") else RuntimeError(f"sandbox service: {op}: {error}")
        return reply

    async def create(self, request: SandboxRequest) -> str:
        """A new sandbox's id. A service found dead on the way (its sandboxes died with it) is started again once."""
        try:
            reply = await self.call("create", request=request_to_json(request))
        except SandboxLost:
            await asyncio.sleep(0)  # let the reply pump see the end of the connection
            if self.connected:
                raise
            await self.start()
            reply = await self.call("create", request=request_to_json(request))
        return str(reply["sandbox_id"])

    async def destroy(self, sandbox_id: str) -> None:
        """Destroy a sandbox; nothing to do when the service is gone (its sandboxes died with it)."""
        with contextlib.suppress(SandboxLost):
            await self.call("destroy", sandbox_id=sandbox_id)

    async def end_setup(self, sandbox_id: str) -> None:
        await self.call("end_setup", sandbox_id=sandbox_id)

    async def has(self, sandbox_id: str) -> bool:
        return bool((await self.call("has", sandbox_id=sandbox_id))["live"])

    async def target(self, sandbox_id: str) -> NamespaceTarget | None:
        found = (await self.call("target", sandbox_id=sandbox_id))["target"]
        return None if found is None else NamespaceTarget(pid=int(found["pid"]), namespaces=tuple(found["namespaces"]))

    async def sweep(self, keep: list[str]) -> list[str]:
        """Destroy the sandboxes earlier coordinators made that are not in `keep`; their ids."""
        return [str(s) for s in (await self.call("sweep", keep=keep))["destroyed"]]

    async def health(self) -> dict[str, Any]:
        return await self.call("health")

    def detach(self) -> None:
        """Close this connection and leave the service running (its grace period starts when none is attached)."""
        if self._writer is not None:
            self._writer.close()
        self._access = None

    async def close(self) -> None:
        """Shut the service down (it destroys what is left) and wait until it has gone."""
        if self.connected:
            with contextlib.suppress(SandboxLost):
                await self.call("shutdown")
            if self._pump is not None:
                await self._pump  # the service closes the connection when it exits
            proc = _SPAWNED.pop(self.socket, None)
            if proc is not None:
                await asyncio.to_thread(proc.wait)
        if self._writer is not None:
            self._writer.close()
        self._access = None


async def stop_spawned(cfg: LocalProviderConfig, run_dir: Path) -> None:
    """Shut down a service this process started (`spawn_service`) that still runs with no sandbox: a coordinator
    that failed before its provider attached (or closed) leaves none waiting out its grace period."""
    run_dir = run_dir.resolve()
    proc = _SPAWNED.get(run_dir / SOCKET_NAME)
    if proc is None or proc.poll() is not None:
        _SPAWNED.pop(run_dir / SOCKET_NAME, None)
        return
    client = ServiceClient(cfg, run_dir)
    await client.start()
    if (await client.health())["sandboxes"] == 0:
        await client.close()
    else:  # sandboxes to resume: left to the grace period (or a restarted coordinator)
        client.detach()
