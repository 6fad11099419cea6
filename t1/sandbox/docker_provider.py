"""DockerProvider: a container per sandbox from the task's image, shells through T1's own SSH path.

`create` starts a container (`t1.sandbox.docker_engine`) with the task's limits and no network
unless the task allows the internet, then registers it with an embedded SSH server like the
local provider's (`t1.sandbox.local_server`). Every session enters the container's namespaces
from the host with `nsenter -t <container pid>` and joins its cgroups first, so the container's
memory, pids and CPU limits bound every shell, and framing, timeouts, PTYs and SFTP are those of
every other provider. Sessions run as the container's root without capabilities and with
`no_new_privs`; the image must have `setpriv` (util-linux) and bash, and `sftp-server` for SFTP.
Verifier shells share the agent's login here (`SshSandbox.separates_verifier` is False).
`destroy` kills the sessions and removes the container; `start` sweeps containers of dead runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from pathlib import Path

from t1.config.sandbox import DockerProviderConfig, ShellConfig
from t1.sandbox.bwrap import NamespaceTarget, SandboxTree
from t1.sandbox.docker_engine import ContainerSpec, Engine, cgroup_procs
from t1.sandbox.local_server import LocalSshServer
from t1.sandbox.ssh_sandbox import SshEndpoint, SshSandbox
from t1.sandbox.types import Sandbox, SandboxRequest, ShellRole
from t1.tasks.needs import NeedsNetworkError

log = logging.getLogger(__name__)

ENTERED_NAMESPACES = ("mnt", "uts", "ipc", "net", "pid", "cgroup")


def container_namespaces(pid: int) -> tuple[str, ...]:
    """The namespaces of `pid` that T1's own process does not share (the ones a session must enter)."""
    own = {name: os.readlink(f"/proc/self/ns/{name}") for name in ENTERED_NAMESPACES}
    return tuple(name for name in ENTERED_NAMESPACES if os.readlink(f"/proc/{pid}/ns/{name}") != own[name])


class ContainerSshServer(LocalSshServer):
    """The embedded server with containers instead of bubblewrap inits as the namespaces sessions enter."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.targets: dict[str, NamespaceTarget] = {}

    async def ns_target(self, tree: SandboxTree, role: ShellRole = ShellRole.AGENT) -> NamespaceTarget | None:
        # a container has one system: verifier sessions enter it as agent sessions do (separates_verifier False)
        del role
        target = self.targets.get(tree.sandbox_id)
        if target is None:
            raise RuntimeError(f"sandbox {tree.sandbox_id} has no container (destroyed?)")
        return target


class DockerProvider:
    """Sandboxes as containers of a Docker engine, reached through the embedded SSH server."""

    def __init__(self, cfg: DockerProviderConfig, shell_cfg: ShellConfig) -> None:
        self.cfg = cfg
        self.shell_cfg = shell_cfg
        self.server = ContainerSshServer(cfg.host, cfg.port)
        self.engine: Engine | None = None
        self._containers: dict[str, str] = {}
        self._sandboxes: dict[str, SshSandbox] = {}
        self._start_lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._start_lock:
            if self.engine is not None:
                return
            engine = Engine(self.cfg.socket, self.cfg.pull)
            await asyncio.to_thread(engine.ping)
            await asyncio.to_thread(engine.sweep)
            await self.server.start()
            self.engine = engine

    def _network(self, request: SandboxRequest) -> str:
        if not request.allow_network:
            return "none"
        if self.cfg.internet_network is None:
            raise NeedsNetworkError("the task allows the internet and sandbox.docker.internet_network names no "
                                    "engine network for it (one that cannot reach the host or T1's services)")
        return self.cfg.internet_network

    def _spec(self, sandbox_id: str, request: SandboxRequest) -> ContainerSpec:
        return ContainerSpec(
            sandbox_id=sandbox_id, image=request.docker_image or self.cfg.default_image,
            memory_mb=request.memory_mb or self.cfg.memory_mb, cpus=request.cpus or self.cfg.cpus,
            pids=self.cfg.pids, network=self._network(request), env=request.env,
        )

    async def create(self, request: SandboxRequest) -> Sandbox:
        await self.start()
        assert self.engine is not None
        sandbox_id = "sb-" + secrets.token_hex(6)
        container = await asyncio.wait_for(asyncio.to_thread(self.engine.start, self._spec(sandbox_id, request)),
                                           self.cfg.start_timeout_s)
        self._containers[sandbox_id] = container.id
        try:
            pid = int(container.attrs["State"]["Pid"])
            tree = SandboxTree(sandbox_id=sandbox_id, root=Path("/proc", str(pid), "root"), uid=None,
                               allow_network=request.allow_network, limits=self.cfg.limits, env=request.env,
                               cgroup_procs=cgroup_procs(pid))
            self.server.trees[sandbox_id] = tree
            self.server.targets[sandbox_id] = NamespaceTarget(pid=pid, namespaces=container_namespaces(pid))
            endpoint = SshEndpoint(
                host=self.server.host, port=self.server.port, user=sandbox_id,
                client_keys=(self.server.client_key,), host_keys=(self.server.host_key.convert_to_public(),),
            )
            sandbox = await SshSandbox.connect(sandbox_id, endpoint, self.shell_cfg)
        except BaseException:
            await self._forget(sandbox_id)
            raise
        self._sandboxes[sandbox_id] = sandbox
        return sandbox

    def container_id(self, sandbox_id: str) -> str:
        """The engine's id of a live sandbox's container."""
        return self._containers[sandbox_id]

    async def _forget(self, sandbox_id: str) -> None:
        await self.server.end_sandbox(sandbox_id)
        self.server.trees.pop(sandbox_id, None)
        self.server.targets.pop(sandbox_id, None)
        container_id = self._containers.pop(sandbox_id, None)
        if container_id is not None and self.engine is not None:
            await asyncio.to_thread(self.engine.remove, container_id)

    async def destroy(self, sandbox: Sandbox) -> None:
        ssh_sandbox = self._sandboxes.pop(sandbox.id, None)
        if ssh_sandbox is not None:
            await ssh_sandbox.close()
        await self._forget(sandbox.id)

    async def close(self) -> None:
        for sandbox in list(self._sandboxes.values()):
            await self.destroy(sandbox)
        await self.server.close()
        if self.engine is not None:
            self.engine.close()
            self.engine = None
