"""DockerProvider: a container per sandbox from the task's image, shells through T1's own SSH path.

`create` starts a container (`t1.sandbox.docker.docker_engine`) from the task's image (or the one its
Dockerfile builds: the `ImageBuilder` it is given, `t1.tasks.image.docker_build` in T1) with the
task's limits and no network unless the task allows the internet, then registers it with an embedded
SSH server like the local provider's (`t1.sandbox.local.local_server`). Every session enters the
container's namespaces from the host with `nsenter -t <container pid>` and joins its cgroups first,
so the container's memory, pids and CPU limits bound every shell, and framing, timeouts, PTYs and
SFTP are those of every other provider. Sessions run as the container's root without capabilities
and with `no_new_privs`; the image must have `setpriv` (util-linux) and bash, and `sftp-server` for
SFTP. Verifier shells (on overlay2, T1 running as root) log in as a user of their own: they enter
the container as `VERIFIER_UID` (`t1.sandbox.verifier.enter_verifier`), in a cgroup of their own with the
same limits, with /tests, /logs/verifier and the toolchain on tmpfs mounts only that uid can reach,
and run the system as the task's setup left it (`t1.sandbox.docker.docker_pristine`), never the agent's.
`destroy` kills the sessions and removes the container; `start` sweeps containers of dead runs.
Containers outlive their coordinator: given the run dir, they carry the run's labels
(`t1.sandbox.run_lease`), and a restarted coordinator's provider `reattach`es one by its container
id once it checks that the container runs, is the sandbox the record names and belongs to this run.
`listen_inside` opens a harness's gateway port on the loopback of the container's own network
namespace (`t1.sandbox.loopback_port`, as the local provider does): only that container reaches it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import secrets
import socket
from collections.abc import Callable, Collection
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import docker
from docker.models.containers import Container

from t1.config.sandbox import DockerProviderConfig, ShellConfig
from t1.sandbox.docker.docker_engine import LABEL_SANDBOX, ContainerSpec, Engine, cgroup_procs
from t1.sandbox.docker.docker_pristine import OVERLAY2, ContainerPristine, container_layers
from t1.sandbox.isolation.bwrap import NamespaceTarget, SandboxTree
from t1.sandbox.isolation.cgroups import CgroupLimits, SandboxCgroups
from t1.sandbox.isolation.mountns import mount_thread
from t1.sandbox.isolation.pristine import PristineState
from t1.sandbox.local.local_server import LocalSshServer, verifier_user
from t1.sandbox.loopback_port import LoopbackPortError, listen_in_namespace
from t1.sandbox.needs import NeedsImageError, NeedsNetworkError
from t1.sandbox.run_lease import RunLease
from t1.sandbox.ssh.framing import SUPERVISOR_BASH
from t1.sandbox.ssh.remote import check_record
from t1.sandbox.ssh.ssh_sandbox import SshEndpoint, SshSandbox
from t1.sandbox.types import (
    BUILT_MARKER,
    IMAGE_TRAITS,
    Sandbox,
    SandboxGone,
    SandboxRecord,
    SandboxRequest,
    ShellRole,
)
from t1.sandbox.verifier.verifier_role import ETC_DIR, PRISTINE_DIR, VERIFIER_DIRS, VERIFIER_UID

log = logging.getLogger(__name__)

ENTERED_NAMESPACES = ("mnt", "uts", "ipc", "net", "pid", "cgroup")
LABEL_PROVIDER = "t1.provider"
"""The provider object that made a container (a token): a restarted coordinator's sweep spares its own."""
MOUNT_POINT_TMPFS = "mode=755,size=1m"


class EnvironmentImage(Protocol):
    """An image built from a task's environment: its tag, and the marker telling provisioning what it sets."""

    @property
    def tag(self) -> str: ...

    def marker(self) -> bytes:
        """BUILT_MARKER's contents (JSON)."""
        ...


class EnvironmentImages(Protocol):
    """Builds (or finds cached) the image of a task's environment folder on the provider's engine."""

    async def image(self, context: Path, network: str) -> EnvironmentImage: ...


ImageBuilder = Callable[[docker.DockerClient, float], EnvironmentImages]
"""Makes the environment builder for an engine's client and a build timeout
(`t1.tasks.image.docker_build.EnvironmentBuilder`)."""


def inside_container(pid: int, fn: Callable[[], object]) -> None:
    """Run `fn` in the mount namespace of the container whose first process is `pid` (blocking): its paths
    resolve in the container's own root, and what it writes goes through the container's own mounts."""
    ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        mount_thread().inside(ns, fn)
    finally:
        os.close(ns)


def write_built_marker(pid: int, body: bytes) -> None:
    """BUILT_MARKER in the container, written through its own mount namespace (blocking; before any session).
    Not the engine's put_archive: a file the engine put into a running container's layer from outside was now and
    then not seen by the container's shells (provisioning then replayed the Dockerfile: docs/docker.md)."""
    def write() -> None:
        os.makedirs(posixpath.dirname(BUILT_MARKER), mode=0o755, exist_ok=True)
        fd = os.open(BUILT_MARKER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
    inside_container(pid, write)


def close_verifier_dirs(pid: int) -> None:
    """Give the verifier's tmpfs dirs to its uid, mode 0700, from the host (blocking; before any session).

    The engine copies what the image has at those paths onto each tmpfs, owner and mode included
    (an image's `/tests` is root's, 0755), whatever the mount options said.
    """
    def close_all() -> None:  # in the container's mount namespace: its paths resolve in its own root
        for path in VERIFIER_DIRS.values():
            if os.path.islink(path) or not os.path.isdir(path):
                raise RuntimeError(f"the container has no verifier directory {path} (the engine did not mount it)")
            os.chown(path, VERIFIER_UID, VERIFIER_UID, follow_symlinks=False)
            os.chmod(path, 0o700)
    inside_container(pid, close_all)


SUPERVISOR_DIR = posixpath.dirname(SUPERVISOR_BASH)
SUPERVISOR_TMPFS = "mode=755,size=8m,exec"


def install_supervisor_bash(pid: int) -> None:
    """The container's own bash, copied execute-only (mode 0111, owned by the verifier's uid) to SUPERVISOR_BASH
    in the container, from the host (blocking; before any session): a supervisor running it is not dumpable, so
    the agent's code (the container's root, no capabilities) can read neither its memory nor its token."""
    def install() -> None:  # in the container's mount namespace: the image's bash, links resolved in its root
        source = next((p for p in ("/usr/bin/bash", "/bin/bash") if os.path.isfile(p)), None)
        if source is None:
            return  # an image without bash: the shells cannot start anyway, and say so
        with open(source, "rb") as f:
            data = f.read()
        fd = os.open(SUPERVISOR_BASH, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o100)
        try:
            os.write(fd, data)
            os.fchown(fd, VERIFIER_UID, VERIFIER_UID)
            os.fchmod(fd, 0o111)
        finally:
            os.close(fd)
    inside_container(pid, install)


def verifier_tmpfs(size_mb: int) -> tuple[tuple[str, str], ...]:
    """The container's tmpfs mounts for a separate verifier (pure): its dirs, closed to all but its uid, and
    the mount points its sessions use (mount points: the agent can neither replace nor unmount them)."""
    own = f"uid={VERIFIER_UID},gid={VERIFIER_UID},mode=0700,size={size_mb}m,exec"
    return (*((path, own) for path in VERIFIER_DIRS.values()),
            (PRISTINE_DIR, MOUNT_POINT_TMPFS), (ETC_DIR, MOUNT_POINT_TMPFS), (SUPERVISOR_DIR, SUPERVISOR_TMPFS))


def container_namespaces(pid: int) -> tuple[str, ...]:
    """The namespaces of `pid` that T1's own process does not share (the ones a session must enter)."""
    own = {name: os.readlink(f"/proc/self/ns/{name}") for name in ENTERED_NAMESPACES}
    return tuple(name for name in ENTERED_NAMESPACES if os.readlink(f"/proc/{pid}/ns/{name}") != own[name])


class ContainerSshServer(LocalSshServer):
    """The embedded server with containers instead of bubblewrap inits as the namespaces sessions enter."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.targets: dict[str, NamespaceTarget] = {}
        self.pristine: dict[str, ContainerPristine] = {}

    async def ns_target(self, tree: SandboxTree, role: ShellRole = ShellRole.AGENT) -> NamespaceTarget | None:
        target = self.targets.get(tree.sandbox_id)
        if target is None:
            raise RuntimeError(f"sandbox {tree.sandbox_id} has no container (destroyed?)")
        pristine = self.pristine.get(tree.sandbox_id)
        if role is ShellRole.VERIFIER and pristine is not None:
            async with self._init_locks.setdefault(tree.sandbox_id, asyncio.Lock()):
                await asyncio.to_thread(pristine.ensure)
        return target

    async def end_setup(self, sandbox_id: str) -> None:
        """The task's setup is done: fix the system the sandbox's verifier runs (`ContainerPristine.end_setup`)."""
        pristine = self.pristine.get(sandbox_id)
        if pristine is None:
            raise RuntimeError(f"sandbox {sandbox_id} has no container with a pristine system (destroyed?)")
        async with self._init_locks.setdefault(sandbox_id, asyncio.Lock()):
            await asyncio.to_thread(pristine.end_setup)

    def forget(self, sandbox_id: str) -> None:
        self.trees.pop(sandbox_id, None)
        self.targets.pop(sandbox_id, None)
        self.pristine.pop(sandbox_id, None)
        self._init_locks.pop(sandbox_id, None)


def mounted_at(pid: int, path: str) -> bool:
    """Whether something is mounted at `path` in the mount namespace of `pid`."""
    with open(f"/proc/{pid}/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def record_env(record: SandboxRecord) -> tuple[tuple[str, str], ...]:
    """The task's environment a docker sandbox's record keeps (JSON pairs), else SandboxGone naming the fault."""
    try:
        pairs = json.loads(record.data.get("env", "[]"))
        return tuple((str(k), str(v)) for k, v in pairs)
    except (ValueError, TypeError) as exc:
        raise SandboxGone(f"sandbox record of {record.sandbox_id}: 'env' is not a JSON list of pairs: {exc}") from None


class DockerProvider:
    """Sandboxes as containers of a Docker engine, reached through the embedded SSH server."""

    survives_coordinator = True
    traits = IMAGE_TRAITS

    def __init__(self, cfg: DockerProviderConfig, shell_cfg: ShellConfig, run_dir: Path | None = None,
                 images: ImageBuilder | None = None) -> None:
        """`images` builds the images of tasks' Dockerfiles; without it such a task is refused (needs_image)."""
        self.run = RunLease.of(run_dir) if run_dir is not None else None
        """The run whose containers this provider makes and may reattach (none: it reattaches none)."""
        self._token = secrets.token_hex(8)
        """Labels this provider's own containers (`LABEL_PROVIDER`): `sweep_unclaimed` spares them, in flight or not."""
        self.cfg = cfg
        self._images = images
        self.shell_cfg = shell_cfg
        self.server = ContainerSshServer(cfg.host, cfg.port)
        self.engine: Engine | None = None
        self._containers: dict[str, str] = {}
        self._sandboxes: dict[str, SshSandbox] = {}
        self._start_lock = asyncio.Lock()
        self.separates_verifier = False
        """Whether verifier shells get a user and a system of their own (overlay2 and T1 as root), set at start."""
        self.cgroups: SandboxCgroups | None = None
        self.builder: EnvironmentImages | None = None

    async def start(self) -> None:
        async with self._start_lock:
            if self.engine is not None:
                return
            engine = Engine(self.cfg.socket, self.cfg.pull)
            self.builder = self._images(engine.client, self.cfg.build_timeout_s) if self._images else None
            await asyncio.to_thread(engine.ping)
            await asyncio.to_thread(engine.sweep)
            driver = await asyncio.to_thread(engine.storage_driver)
            self.separates_verifier = driver == OVERLAY2 and os.geteuid() == 0
            if self.separates_verifier:
                self.cgroups = await asyncio.to_thread(SandboxCgroups.create)
            else:
                log.warning("docker sandboxes: verifier shells share the agent's login (the verifier's own user and "
                            "pristine system need the overlay2 storage driver and T1 running as root; driver %r, "
                            "uid %d)", driver, os.geteuid())
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
            tmpfs=verifier_tmpfs(self.cfg.verifier_tmpfs_mb) if self.separates_verifier else (),
            storage_mb=request.storage_mb,
            labels=((LABEL_PROVIDER, self._token), *(self.run.labels().items() if self.run is not None else ())),
        )

    async def create(self, request: SandboxRequest) -> Sandbox:
        await self.start()
        assert self.engine is not None
        sandbox_id = "sb-" + secrets.token_hex(6)
        spec = self._spec(sandbox_id, request)
        built = None
        if self.cfg.build and request.build_context is not None and request.docker_image is None:
            if self.builder is None:
                raise NeedsImageError(f"the environment at {request.build_context} is built from its Dockerfile and "
                                      "this docker provider was made without an image builder")
            built = await self.builder.image(request.build_context, spec.network)
            spec = replace(spec, image=built.tag)
        container = await asyncio.wait_for(asyncio.to_thread(self.engine.start, spec), self.cfg.start_timeout_s)
        self._containers[sandbox_id] = container.id
        try:
            if built is not None:  # provisioning applies what the image sets instead of replaying its Dockerfile
                await asyncio.to_thread(write_built_marker, int(container.attrs["State"]["Pid"]), built.marker())
            sandbox = await self._register(sandbox_id, container, request.allow_network, request.env,
                                           CgroupLimits(spec.memory_mb, spec.pids, spec.cpus), fresh=True)
        except BaseException:
            await self._forget(sandbox_id)
            raise
        self._sandboxes[sandbox_id] = sandbox
        return sandbox

    async def reattach(self, record: SandboxRecord) -> Sandbox:
        """The running container `record` names, registered with this provider's server (`SandboxProvider.reattach`).

        The system its verifier runs is the one fixed at its end_setup (kept beside its writable layer)."""
        check_record(record, "docker", ("container",))
        await self.start()
        assert self.engine is not None
        sandbox_id = record.sandbox_id
        if sandbox_id in self._sandboxes:
            raise SandboxGone(f"sandbox {sandbox_id} is already attached by this coordinator")
        if self.run is None:
            raise SandboxGone(f"sandbox {sandbox_id}: this docker provider was given no run dir, so no container "
                              "is of its run")
        container = await asyncio.to_thread(self.engine.get, record.data["container"])
        if container is None:
            raise SandboxGone(f"sandbox {sandbox_id}: its container {record.data['container'][:12]} no longer exists")
        labels = container.labels
        if labels.get(LABEL_SANDBOX) != sandbox_id:
            raise SandboxGone(f"sandbox {sandbox_id}: container {container.short_id} is sandbox "
                              f"{labels.get(LABEL_SANDBOX)!r}, not this one")
        if not self.run.matches(labels):
            raise SandboxGone(f"sandbox {sandbox_id}: container {container.short_id} belongs to another run "
                              f"({labels.get('t1.run.lock')!r}), not this one ({self.run.lock})")
        state = container.attrs["State"]
        if not state.get("Running") or not state.get("Pid"):
            raise SandboxGone(f"sandbox {sandbox_id}: container {container.short_id} is not running "
                              f"({state.get('Status')}, exit code {state.get('ExitCode')})")
        host = container.attrs["HostConfig"]
        limits = CgroupLimits(memory_mb=int(host.get("Memory") or 0) // (1 << 20) or self.cfg.memory_mb,
                              pids=int(host.get("PidsLimit") or 0) or self.cfg.pids,
                              cpus=int(host.get("NanoCpus") or 0) / 1e9 or self.cfg.cpus)
        env = record_env(record)
        self._containers[sandbox_id] = container.id
        try:
            sandbox = await self._register(sandbox_id, container, host.get("NetworkMode") != "none",
                                           env, limits, fresh=False)
        except BaseException:
            self._containers.pop(sandbox_id, None)
            self.server.forget(sandbox_id)
            if self.cgroups is not None:
                await asyncio.to_thread(self.cgroups.remove, sandbox_id + "-verifier")
            raise
        self._sandboxes[sandbox_id] = sandbox
        return sandbox

    async def _register(self, sandbox_id: str, container: Container, allow_network: bool,
                        env: tuple[tuple[str, str], ...], limits: CgroupLimits, fresh: bool) -> SshSandbox:
        """Register a running container with the server (its tree, namespaces, verifier) and connect to it.
        `fresh`: just started, so its verifier dirs are closed and the supervisor's bash installed now."""
        pid = int(container.attrs["State"]["Pid"])
        layers = container_layers(container.attrs) if self.separates_verifier else None
        if self.separates_verifier and layers is None:
            raise RuntimeError(f"container of sandbox {sandbox_id} reports no overlay2 layers "
                               f"(GraphDriver {container.attrs.get('GraphDriver')!r})")
        verifier_cgroup = (self.cgroups.add(sandbox_id + "-verifier", limits)
                           if self.cgroups is not None else ())  # an agent at its limits does not stop the verifier
        # The container's root is copy-on-write (`overlay`): its verifier builds its root over the pristine system.
        tree = SandboxTree(sandbox_id=sandbox_id, root=Path("/proc", str(pid), "root"), uid=None,
                           allow_network=allow_network, limits=self.cfg.limits, env=env,
                           cgroup_procs=cgroup_procs(pid), overlay=layers is not None,
                           verifier_uid=VERIFIER_UID if layers is not None else None,
                           verifier_cgroup_procs=verifier_cgroup)
        if layers is not None and fresh:
            await asyncio.to_thread(close_verifier_dirs, pid)
            await asyncio.to_thread(install_supervisor_bash, pid)
        self.server.trees[sandbox_id] = tree
        self.server.targets[sandbox_id] = NamespaceTarget(pid=pid, namespaces=container_namespaces(pid))
        endpoint = SshEndpoint(
            host=self.server.host, port=self.server.port, user=sandbox_id,
            client_keys=(self.server.client_key,), host_keys=(self.server.host_key.convert_to_public(),),
        )
        record = ("docker", {"container": container.id, "env": json.dumps([list(kv) for kv in env])})
        if layers is None:
            return await SshSandbox.connect(sandbox_id, endpoint, self.shell_cfg, record=record)
        pristine = ContainerPristine(sandbox_id, pid, layers)
        if not fresh:  # what an earlier coordinator attached is still mounted in the container
            if layers.setup_copy.is_dir():
                pristine.state = PristineState.SETUP
            elif await asyncio.to_thread(mounted_at, pid, PRISTINE_DIR):
                pristine.state = PristineState.HOST
        self.server.pristine[sandbox_id] = pristine
        return await SshSandbox.connect(sandbox_id, endpoint, self.shell_cfg,
                                        verifier=replace(endpoint, user=verifier_user(sandbox_id)),
                                        on_end_setup=lambda: self.server.end_setup(sandbox_id), record=record)

    async def listen_inside(self, sandbox_id: str, port: int) -> socket.socket:
        """A socket listening on 127.0.0.1:`port` in the container's own network namespace, held by T1
        (`t1.sandbox.loopback_port`): a harness's gateway that only this container reaches."""
        target = self.server.targets.get(sandbox_id)
        if target is None:
            raise LoopbackPortError(f"sandbox {sandbox_id} is not live")
        if "net" not in target.namespaces:
            raise LoopbackPortError(f"the container of sandbox {sandbox_id} shares T1's network namespace: "
                                    "a gateway there would be reachable from outside it")
        return await asyncio.to_thread(listen_in_namespace, target.pid, port)

    async def sweep_unclaimed(self, keep: Collection[str] = ()) -> int:
        """Remove this run's containers that earlier coordinators made, this provider has not reattached and `keep`
        does not name (`SweepsUnclaimed`); how many."""
        if self.run is None:
            return 0
        await self.start()
        assert self.engine is not None
        mine = set(self._containers.values())
        found = await asyncio.to_thread(self.engine.client.containers.list, all=True,
                                        filters={"label": LABEL_SANDBOX})
        stale = [c for c in found if self.run.matches(c.labels) and c.id not in mine
                 and c.labels.get(LABEL_PROVIDER) != self._token and c.labels.get(LABEL_SANDBOX) not in keep]
        for container in stale:
            await asyncio.to_thread(self.engine.remove, container.id)
        if stale:
            log.info("removed %d containers of earlier coordinators of this run that this one did not reattach",
                     len(stale))
        return len(stale)

    def container_id(self, sandbox_id: str) -> str:
        """The engine's id of a live sandbox's container."""
        return self._containers[sandbox_id]

    async def _forget(self, sandbox_id: str) -> None:
        await self.server.end_sandbox(sandbox_id)
        self.server.forget(sandbox_id)
        container_id = self._containers.pop(sandbox_id, None)
        if container_id is not None and self.engine is not None:
            await asyncio.to_thread(self.engine.remove, container_id)
        if self.cgroups is not None:
            await asyncio.to_thread(self.cgroups.remove, sandbox_id + "-verifier")

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
        if self.cgroups is not None:
            self.cgroups.close()
            self.cgroups = None
