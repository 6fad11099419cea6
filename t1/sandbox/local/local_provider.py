"""LocalProvider: sandboxes as fresh directory trees served by the embedded SSH server.

The machinery (the server, the trees, their namespace holders, cgroups, uids; `t1.sandbox.local.local_host`)
runs in one of two places:

- In a coordinator's run (a run dir, `sandbox.local.service` on): in the run's sandbox service
  (`t1.sandbox.local.service`), a process of its own that outlives the coordinator, so
  `survives_coordinator` is True and a restarted coordinator of the same run dir `reattach`es its
  sandboxes; the service destroys them itself once no coordinator has attached for
  `sandbox.local.service_grace_s`.
- Otherwise (tests, the CLI): in this process, and the sandboxes die with it.

Either way `create` asks for a tree and connects to it over loopback SSH with the key the server
generated; `destroy` closes the connection, kills every session and the init (so every process of
the sandbox) and deletes the tree.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.isolation.bwrap import NamespaceTarget, SandboxTree
from t1.sandbox.isolation.cgroups import SandboxCgroups
from t1.sandbox.local.local_host import LocalSandboxHost, SshAccess
from t1.sandbox.local.local_server import LocalSshServer, verifier_user
from t1.sandbox.local.service_client import ServiceClient
from t1.sandbox.loopback_port import LoopbackPortError, listen_in_namespace
from t1.sandbox.ssh.remote import check_record
from t1.sandbox.ssh.ssh_sandbox import SshEndpoint, SshSandbox
from t1.sandbox.types import LOCAL_TRAITS, Sandbox, SandboxGone, SandboxLost, SandboxRecord, SandboxRequest

log = logging.getLogger(__name__)

SERVICE_ANSWER_S = 10.0
"""How long a sandbox service that still runs takes at most to answer `health` (else it counts as gone)."""


class LocalBackend(Protocol):
    """Where the local sandboxes live: this process (`LocalSandboxHost`) or the run's service (`ServiceClient`)."""

    async def start(self) -> SshAccess: ...

    async def create(self, request: SandboxRequest) -> str: ...

    async def destroy(self, sandbox_id: str) -> None: ...

    async def end_setup(self, sandbox_id: str) -> None: ...

    async def target(self, sandbox_id: str) -> NamespaceTarget | None: ...

    async def close(self) -> None: ...


class LocalProvider:
    """The default provider: bubblewrap trees behind an SSH server on 127.0.0.1."""

    traits = LOCAL_TRAITS

    def __init__(self, cfg: LocalProviderConfig, shell_cfg: ShellConfig, run_dir: Path | None = None) -> None:
        self.cfg = cfg
        self.shell_cfg = shell_cfg
        self.root = cfg.root.resolve()
        self.backend: LocalBackend = (ServiceClient(cfg, run_dir) if run_dir is not None and cfg.service
                                      else LocalSandboxHost(cfg))
        self.survives_coordinator = isinstance(self.backend, ServiceClient)
        """In a run with the sandbox service: its sandboxes outlive this process; otherwise they die with it."""
        self._sandboxes: dict[str, SshSandbox] = {}

    @property
    def service(self) -> ServiceClient | None:
        """The run's sandbox service, where this provider has one."""
        return self.backend if isinstance(self.backend, ServiceClient) else None

    def _host(self) -> LocalSandboxHost:
        if not isinstance(self.backend, LocalSandboxHost):
            raise RuntimeError("the local sandboxes of this provider live in the sandbox service process, "
                               "not in this one")
        return self.backend

    @property
    def server(self) -> LocalSshServer:
        """The embedded server (only where the sandboxes live in this process)."""
        return self._host().server

    @property
    def cgroups(self) -> SandboxCgroups | None:
        """The sandboxes' cgroups (only where the sandboxes live in this process)."""
        return self._host().cgroups

    async def start(self) -> None:
        """Serve (in this process, or by attaching to the run's service, started if needed); what dead runs
        left on the root is swept first."""
        await self.backend.start()

    async def _connect(self, sandbox_id: str) -> SshSandbox:
        access = await self.backend.start()
        endpoint = SshEndpoint(host=access.host, port=access.port, user=sandbox_id,
                               client_keys=(access.client_key,), host_keys=(access.host_key,))
        return await SshSandbox.connect(sandbox_id, endpoint, self.shell_cfg,
                                        verifier=replace(endpoint, user=verifier_user(sandbox_id)),
                                        on_end_setup=lambda: self.backend.end_setup(sandbox_id),
                                        record=("local", {"root": str(self.root)}),
                                        host_lost=self._service_lost if self.service is not None else None)

    async def _service_lost(self) -> str | None:
        """Why the run's sandbox service is gone (it does not answer), or None while it serves."""
        assert self.service is not None
        try:
            await asyncio.wait_for(self.service.health(), SERVICE_ANSWER_S)
        except (SandboxLost, TimeoutError) as exc:
            return f"the sandbox service (pid {self.service.pid}) is gone: {exc}"
        return None

    async def create(self, request: SandboxRequest) -> Sandbox:
        await self.start()
        sandbox_id = await self.backend.create(request)
        try:
            sandbox = await self._connect(sandbox_id)
        except BaseException:
            await asyncio.shield(self.backend.destroy(sandbox_id))
            raise
        self._sandboxes[sandbox_id] = sandbox
        return sandbox

    async def reattach(self, record: SandboxRecord) -> Sandbox:
        """A sandbox of this run's service (`survives_coordinator`), reconnected; SandboxGone when it is not live."""
        service = self.service
        if service is None:
            raise SandboxGone(f"sandbox {record.sandbox_id}: the local provider's sandboxes end with the coordinator "
                              "that created them (no sandbox service: no run dir, or sandbox.local.service off)")
        check_record(record, "local", ("root",))
        if record.data["root"] != str(self.root):
            raise SandboxGone(f"sandbox {record.sandbox_id} lives under {record.data['root']}, not this provider's "
                              f"root {self.root}")
        if record.sandbox_id in self._sandboxes:
            raise SandboxGone(f"sandbox {record.sandbox_id} is already attached by this coordinator")
        await self.start()
        if not await service.has(record.sandbox_id):
            raise SandboxGone(f"sandbox {record.sandbox_id} is not live in the sandbox service (pid {service.pid}): "
                              "destroyed, swept, or the service was restarted")
        try:
            sandbox = await self._connect(record.sandbox_id)
        except SandboxLost as exc:
            raise SandboxGone(f"sandbox {record.sandbox_id}: {exc}") from exc
        self._sandboxes[record.sandbox_id] = sandbox
        return sandbox

    async def sweep_unclaimed(self, keep: Collection[str] = ()) -> int:
        """Destroy the sandboxes earlier coordinators of this run left that this one has not reattached and `keep`
        does not name (`SweepsUnclaimed`); how many."""
        if self.service is None:
            return 0
        await self.start()
        return len(await self.service.sweep([*self._sandboxes, *keep]))

    def tree(self, sandbox_id: str) -> SandboxTree:
        """The tree of a live sandbox (only where the sandboxes live in this process)."""
        return self._host().tree(sandbox_id)

    def host_path(self, sandbox_id: str, name: str) -> Path:
        """Where T1 reaches tree dir `name` (`app`, `logs`, ...) of a live sandbox (only where the sandboxes live
        in this process; tests and provisioning may read it)."""
        return self._host().host_path(sandbox_id, name)

    async def listen_inside(self, sandbox_id: str, port: int) -> socket.socket:
        """A socket listening on 127.0.0.1:`port` in the sandbox's own network namespace, held by this process
        (`t1.sandbox.loopback_port`): a harness's gateway that only this sandbox reaches."""
        try:
            target = await self.backend.target(sandbox_id)
        except SandboxGone as exc:
            raise LoopbackPortError(str(exc)) from None
        if target is None or "net" not in target.namespaces:
            raise LoopbackPortError(f"sandbox {sandbox_id} shares T1's network (sandbox.local.bubblewrap is off): "
                                     "a gateway there would be reachable from outside it")
        return await asyncio.to_thread(listen_in_namespace, target.pid, port)

    async def destroy(self, sandbox: Sandbox) -> None:
        ssh_sandbox = self._sandboxes.pop(sandbox.id, None)
        if ssh_sandbox is not None:
            await ssh_sandbox.close()
        await self.backend.destroy(sandbox.id)

    async def close(self) -> None:
        """Destroy this provider's sandboxes and stop serving: in the service's case, shut it down (it destroys
        what no coordinator reattached)."""
        for sandbox in list(self._sandboxes.values()):
            await self.destroy(sandbox)
        await self.backend.close()
