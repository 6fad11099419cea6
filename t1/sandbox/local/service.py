"""The local sandbox service: local sandboxes in a process of their own that outlives the coordinator.

`python -m t1.sandbox.local.service CONFIG` (started by `LocalProvider` for a coordinator's run,
`t1.sandbox.local.service_client`) runs a `LocalSandboxHost`: the embedded SSH server, the sandbox
trees and their namespace holders, whose lifeline pipe (`t1.sandbox.isolation.holders`) is this process's.
So a kill -9 of the coordinator leaves every sandbox running, reachable over SSH by the
restarted coordinator of the same run dir; a kill -9 of the service ends every sandbox (their
episodes lose their connections: `SandboxLost`).

Control: a unix socket in the run dir, created owner-only (mode 0600) and answering only peers of
this process's uid (or root). One JSON object a line each way; a request `{"id", "op", ...}` gets
`{"id", "ok": true, ...}` or `{"id", "ok": false, "error", "gone"}`, requests of one connection
served concurrently. Ops: `attach` (the coordinator's: returns the SSH server's address and
keys), `create` (a `SandboxRequest`), `destroy`, `end_setup`, `target`, `has`, `list`, `health`,
`sweep` (destroy what earlier coordinators made and this one did not reattach) and `shutdown`.

The lifeline rule lives here: while no attached coordinator's connection is open (from start,
or since the last one closed), a grace timer runs (`sandbox.local.service_grace_s`); when it
expires while no process holds the run dir's lock (a coordinator still starting holds it:
`t1.sandbox.run_lease`), the service destroys every sandbox (their processes, mounts and
cgroups) and exits; otherwise the timer runs again.
SIGTERM, SIGINT and `shutdown` do the same at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t1.config.sandbox import LocalProviderConfig
from t1.rpc.loop import run
from t1.sandbox.local.local_host import LocalSandboxHost
from t1.sandbox.local.service_wire import (
    MAX_LINE,
    answers,
    read_message,
    request_from_json,
    unix_path,
    write_message,
)
from t1.sandbox.run_lease import RunLease, locked
from t1.sandbox.types import SandboxGone

log = logging.getLogger(__name__)

SANDBOX_OPS = ("destroy", "end_setup", "has", "target")
"""The ops about one sandbox (they name it: `sandbox_id`)."""


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """What the coordinator starts the service with (a JSON file beside the socket)."""

    local: LocalProviderConfig
    socket: Path
    grace_s: float

    def to_json(self) -> str:
        return json.dumps({"local": self.local.model_dump(mode="json"), "socket": str(self.socket),
                           "grace_s": self.grace_s})

    @classmethod
    def read(cls, path: Path) -> ServiceConfig:
        data = json.loads(path.read_text())
        return cls(LocalProviderConfig.model_validate(data["local"]), Path(data["socket"]), float(data["grace_s"]))


def peer_allowed(sock: socket.socket) -> bool:
    """Whether the peer of a unix connection runs as this process's user or as root."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    uid = int.from_bytes(creds[4:8], sys.byteorder)
    return uid in (0, os.geteuid())


class SandboxService:
    """Serves the control socket and the sandboxes until shut down or orphaned for the grace period."""

    def __init__(self, cfg: ServiceConfig) -> None:
        self.cfg = cfg
        self.host = LocalSandboxHost(cfg.local)
        self.started = time.monotonic()
        self.stopping = asyncio.Event()
        self.run = RunLease.of(cfg.socket.parent)
        """The run whose dir holds the socket: while a process holds its lock (a coordinator starting), it is owned."""
        self._attached = 0
        self._grace: asyncio.TimerHandle | None = None
        self._clients: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}
        self._made_by: dict[str, asyncio.StreamWriter] = {}
        """Sandbox id -> the control connection that created it."""

    def _arm_grace(self) -> None:
        if self._grace is None:
            log.info("no coordinator attached: the sandboxes are destroyed in %.0fs unless one attaches",
                     self.cfg.grace_s)
            self._grace = asyncio.get_running_loop().call_later(self.cfg.grace_s, self._orphaned)

    def _orphaned(self) -> None:
        self._grace = None
        if locked(self.run.lock, self.run.inode):  # a coordinator of the run lives (it attaches once it has started)
            log.info("the run's coordinator holds %s: waiting for it to attach", self.run.lock)
            self._arm_grace()
            return
        log.warning("no coordinator attached for %.0fs (sandbox.local.service_grace_s): destroying %d sandboxes "
                    "and exiting", self.cfg.grace_s, len(self.host.sandbox_ids()))
        self.stopping.set()

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        if answers(self.cfg.socket):
            raise SystemExit(f"another sandbox service serves {self.cfg.socket}; this one exits")
        with contextlib.suppress(FileNotFoundError):
            self.cfg.socket.unlink()  # a dead service's
        old_umask = os.umask(0o177)  # the socket is made owner-only, never briefly open to others
        try:
            with unix_path(self.cfg.socket) as path:
                server = await asyncio.start_unix_server(self._client, path=path, limit=MAX_LINE)
        finally:
            os.umask(old_umask)
        self._arm_grace()
        print(f"t1 sandbox service (pid {os.getpid()}) listening on unix:{self.cfg.socket}", flush=True)
        try:
            await self.stopping.wait()
        finally:
            server.close()
            with contextlib.suppress(FileNotFoundError):
                self.cfg.socket.unlink()
            await self.host.close()
            for writer in self._clients:  # the control connections close only now: a shutdown's caller waits for it
                writer.close()
            await asyncio.gather(*self._clients.values(), return_exceptions=True)
            log.info("sandbox service stopped")

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is None or not peer_allowed(sock):
            log.warning("refused a control connection from another user")
            writer.close()
            return
        me = asyncio.current_task()
        if me is not None:
            self._clients[writer] = me
        attached = False
        lock = asyncio.Lock()
        tasks: set[asyncio.Task[None]] = set()
        try:
            while (message := await read_message(reader)) is not None:
                if message.get("op") == "attach" and not attached:
                    attached = True
                    self._attached += 1
                    if self._grace is not None:
                        self._grace.cancel()
                        self._grace = None
                task = asyncio.ensure_future(self._answer(message, writer, lock))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (ConnectionError, ValueError) as exc:
            log.warning("control connection dropped: %s", exc)
        finally:
            if attached:
                self._attached -= 1
                if self._attached == 0 and not self.stopping.is_set():
                    self._arm_grace()
            writer.close()
            self._clients.pop(writer, None)

    async def _answer(self, message: dict[str, Any], writer: asyncio.StreamWriter, lock: asyncio.Lock) -> None:
        try:
            reply = {"id": message.get("id"), "ok": True, **await self._do(message, writer)}
        except Exception as exc:  # every request gets an answer; the service goes on
            if not isinstance(exc, SandboxGone):
                log.exception("sandbox service: %s failed", message.get("op"))
            reply = {"id": message.get("id"), "ok": False, "error": f"{type(exc).__name__}: {exc}",
                     "gone": isinstance(exc, SandboxGone)}
        async with lock:
            with contextlib.suppress(ConnectionError):
                await write_message(writer, reply)
        if message.get("op") == "shutdown":
            self.stopping.set()

    async def _do(self, message: dict[str, Any], conn: asyncio.StreamWriter) -> dict[str, Any]:
        op, host = message.get("op"), self.host
        if op == "attach":
            access = await host.start()
            return {"host": access.host, "port": access.port, "pid": os.getpid(),
                    "client_key": access.client_key.export_private_key().decode(),
                    "host_key": access.host_key.export_public_key().decode()}
        if op == "create":
            made = await host.create(request_from_json(message.get("request")))
            self._made_by[made] = conn
            return {"sandbox_id": made}
        if op == "health":
            return {"pid": os.getpid(), "sandboxes": len(host.sandbox_ids()), "attached": self._attached,
                    "uptime_s": round(time.monotonic() - self.started, 3), "root": str(host.root),
                    "cgroups": [str(p) for p in host.cgroups.bases.values()] if host.cgroups is not None else []}
        if op == "list":
            return {"sandbox_ids": host.sandbox_ids()}
        if op == "shutdown":
            return {}
        if op == "sweep":
            return {"destroyed": await self._sweep(conn, message.get("keep"))}
        if op not in SANDBOX_OPS:
            raise ValueError(f"unknown op {op!r} (expected attach, create, health, list, shutdown, "
                             f"{', '.join(SANDBOX_OPS)})")
        sandbox_id = message.get("sandbox_id")
        if not isinstance(sandbox_id, str):
            raise ValueError(f"op {op!r} needs a 'sandbox_id' string")
        if op == "destroy":
            await host.destroy(sandbox_id)
            self._made_by.pop(sandbox_id, None)
            return {}
        if op == "end_setup":
            host.tree(sandbox_id)
            await host.end_setup(sandbox_id)
            return {}
        if op == "has":
            return {"live": sandbox_id in host.sandbox_ids()}
        target = await host.target(sandbox_id)  # op "target"
        return {"target": None if target is None else {"pid": target.pid, "namespaces": list(target.namespaces)}}


    async def _sweep(self, conn: asyncio.StreamWriter, keep: object) -> list[str]:
        """Destroy the sandboxes that earlier coordinators made and `conn`'s did not reattach (`keep`); their ids."""
        if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
            raise ValueError(f"sweep: 'keep' must be a list of sandbox ids, got {keep!r}")
        victims = [s for s in self.host.sandbox_ids() if s not in keep and self._made_by.get(s) is not conn]
        for sandbox_id in victims:
            await self.host.destroy(sandbox_id)
            self._made_by.pop(sandbox_id, None)
        if victims:
            log.info("destroyed %d sandboxes of earlier coordinators that this one did not reattach", len(victims))
        return victims


async def main(config: Path) -> None:
    await SandboxService(ServiceConfig.read(config)).serve()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m t1.sandbox.local.service CONFIG_JSON")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("asyncssh").setLevel(logging.WARNING)  # a line per connection and channel otherwise
    run(main(Path(sys.argv[1])))
