"""The Docker Engine side of the docker provider: containers per sandbox, their limits, labels and sweep.

Every container T1 starts carries labels naming the sandbox and the process that owns it (its
host, pid and the pid's start time, so a reused pid is not mistaken for a live owner), and, given
a run dir, the run (`t1.sandbox.run_lease`). A provider starting up removes the containers of
owners that are gone (a coordinator killed with -9) unless their run is live again (its restarted
coordinator reattaches them), so none outlives the next run. The container's first process only holds its namespaces
(`HOLD_COMMAND`,
a bash that reaps orphans); shells enter those namespaces from the host (`t1.sandbox.docker.docker_provider`).
Calls go through the `docker` client library, whose calls block: callers run them in a thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
from docker.models.containers import Container

from t1.sandbox.needs import NeedsImageError
from t1.sandbox.run_lease import run_live

log = logging.getLogger(__name__)

LABEL_SANDBOX = "t1.sandbox"
LABEL_HOST = "t1.owner.host"
LABEL_PID = "t1.owner.pid"
LABEL_START = "t1.owner.start"
HOLD_COMMAND = ["/bin/bash", "--norc", "--noprofile", "-c",
                'echo t1-sandbox-ready; exec {hold}<> <(:); while :; do read -r -u "$hold" _; done']
"""PID 1 of the container: bash blocked on a pipe only it holds, reaping orphans in its SIGCHLD handler. It needs
no lifeline (`t1.sandbox.isolation.holders`): a dead run's containers are found by their owner labels and removed
at start.
Not `sleep` under the engine's `--init`: the agent, the container's root, could kill that sleep and with it
the container; the kernel delivers no signal from inside the namespace to a PID 1 without a handler for it."""
START_ATTEMPTS = 4
START_BACKOFF_S = (1.0, 2.0, 4.0)  # the wait before each attempt after the first
CGROUP_CONTROLLERS = ("memory", "pids", "cpu")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def process_start(pid: int) -> str | None:
    """The start time (clock ticks after boot) of `pid`, or None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def owner_labels() -> dict[str, str]:
    """Labels naming this process as the owner of a container."""
    pid = os.getpid()
    return {LABEL_HOST: socket.gethostname(), LABEL_PID: str(pid), LABEL_START: process_start(pid) or "?"}


def owner_alive(labels: dict[str, str]) -> bool:
    """Whether the owner a container's labels name still runs, or its run has a live coordinator again
    (a container of another host counts as alive)."""
    if labels.get(LABEL_HOST) != socket.gethostname():
        return True
    pid = labels.get(LABEL_PID, "")
    return (pid.isdigit() and process_start(int(pid)) == labels.get(LABEL_START)) or run_live(labels)


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """What one sandbox's container gets from the engine."""

    sandbox_id: str
    image: str
    memory_mb: int
    cpus: float
    pids: int
    network: str
    """The engine network: `none` (loopback only) or the configured internet network."""
    env: tuple[tuple[str, str], ...] = ()
    tmpfs: tuple[tuple[str, str], ...] = ()
    """Container path -> tmpfs mount options (the verifier's dirs and mount points)."""
    storage_mb: int | None = None
    """Size of the container's writable layer, where the storage driver enforces one (`Engine.storage_quota`)."""
    labels: tuple[tuple[str, str], ...] = ()
    """More labels (the run's, `t1.sandbox.run_lease`)."""


def cgroup_procs(pid: int, root: Path = CGROUP_ROOT) -> tuple[str, ...]:
    """The `cgroup.procs` files of `pid`'s memory, pids and cpu cgroups (v1), or its unified one (v2)."""
    found: list[str] = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if names == "" and (root / "cgroup.controllers").exists():
            return (str(root / path.lstrip("/") / "cgroup.procs"),)
        wanted = [c for c in names.split(",") if c in CGROUP_CONTROLLERS]
        if wanted:
            mount = root / names if (root / names).is_dir() else root / wanted[0]
            found.append(str(mount / path.lstrip("/") / "cgroup.procs"))
    if not found:
        raise FileNotFoundError(f"no memory, pids or cpu cgroup for container process {pid} in /proc/{pid}/cgroup")
    return tuple(found)


class Engine:
    """One Docker engine reached over its unix socket (blocking calls)."""

    def __init__(self, socket_path: Path, pull: bool) -> None:
        self.socket_path = socket_path
        self.pull = pull
        self.client = docker.DockerClient(base_url=f"unix://{socket_path}", timeout=120)
        self.storage_quota: bool | None = None
        """Whether the engine enforces a writable layer's size (`--storage-opt size`); None: not tried yet.
        overlay2 does only on xfs mounted with `pquota`; where it does not, the first container asked for
        a size says so once (logged) and containers are made without one."""

    def ping(self) -> None:
        try:
            self.client.ping()
        except (docker.errors.DockerException, OSError) as exc:
            raise ConnectionError(f"sandbox.docker.socket {self.socket_path}: the Docker engine does not answer: "
                                  f"{exc}") from exc

    def ensure_image(self, image: str) -> None:
        """The image is present (pulled when the policy allows), else a needs_image report naming it."""
        try:
            self.client.images.get(image)
            return
        except docker.errors.ImageNotFound:
            if not self.pull:
                raise NeedsImageError(f"image {image} is not on the Docker engine and sandbox.docker.pull is "
                                      "off") from None
        try:
            self.client.images.pull(image)
        except docker.errors.APIError as exc:
            raise NeedsImageError(f"image {image} is not on the Docker engine and cannot be pulled: {exc}") from None

    def start(self, spec: ContainerSpec) -> Container:
        """Create and start the sandbox's container; returns it running (with its host pid in attrs).

        A container whose first process did not start, at the engine's start call (`runc create
        failed: ... stat /bin/bash: no such file or directory`) or right after it (it exited), is
        removed and made again, up to START_ATTEMPTS times with a growing wait between them (7 s in all, inside
        the provider's start_timeout_s); none is left behind. On this machine's
        engine (Docker 28, runc 1.1.5) under heavy load, now and then a container's rootfs lacks its
        image's files when runc looks for the first program (cause not found: docs/docker.md).
        """
        self.ensure_image(spec.image)
        cause = ""
        for attempt in range(1, START_ATTEMPTS + 1):
            if attempt > 1:  # three immediate attempts all failed once, under a load average near 80: wait it out
                time.sleep(START_BACKOFF_S[attempt - 2])
            try:
                container = self._run(spec)
            except docker.errors.APIError as exc:
                if "OCI runtime" not in str(exc):  # not the first process failing to start
                    raise
                cause = str(exc.explanation or exc)
                self.remove(f"t1-{spec.sandbox_id}")  # created, never started: it would be left otherwise
            else:
                container.reload()
                if container.attrs["State"].get("Running") and container.attrs["State"].get("Pid"):
                    return container
                cause = container.logs(tail=20).decode(errors="replace").strip()
                self.remove(container.id)
            log.warning("container of sandbox %s did not start (attempt %d of %d): %s",
                        spec.sandbox_id, attempt, START_ATTEMPTS, cause)
        raise RuntimeError(f"container of sandbox {spec.sandbox_id} from {spec.image} did not start "
                           f"{START_ATTEMPTS} times: {cause}")

    def _run(self, spec: ContainerSpec) -> Container:
        if spec.storage_mb is not None and self.storage_quota is not False:
            try:
                container = self._create(spec, {"size": f"{spec.storage_mb}m"})
                self.storage_quota = True
                return container
            except docker.errors.APIError as exc:
                if "storage-opt" not in str(exc) and "storage opt" not in str(exc).lower():
                    raise
                self.storage_quota = False
                log.warning("the Docker engine enforces no storage_mb (a container's writable layer shares the "
                            "engine's disk): %s", exc.explanation or exc)
        return self._create(spec, None)

    def _create(self, spec: ContainerSpec, storage_opt: dict[str, str] | None) -> Container:
        memory = f"{spec.memory_mb}m"
        return self.client.containers.run(
            spec.image, HOLD_COMMAND, name=f"t1-{spec.sandbox_id}", detach=True,
            labels={**dict(spec.labels), LABEL_SANDBOX: spec.sandbox_id, **owner_labels()},
            network_mode=spec.network, hostname="sandbox",
            mem_limit=memory, memswap_limit=memory, pids_limit=spec.pids, nano_cpus=int(spec.cpus * 1e9),
            environment=dict(spec.env), working_dir="/app", tmpfs=dict(spec.tmpfs), storage_opt=storage_opt,
        )

    def get(self, container_id: str) -> Container | None:
        """The container, inspected now; None when the engine has no such container."""
        try:
            return self.client.containers.get(container_id)
        except docker.errors.NotFound:
            return None

    def remove(self, container_id: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self.client.containers.get(container_id).remove(force=True)

    def sweep(self) -> int:
        """Remove every T1 container whose owner is gone; returns how many."""
        stale = [c for c in self.client.containers.list(all=True, filters={"label": LABEL_SANDBOX})
                 if not owner_alive(c.labels)]
        for container in stale:
            self.remove(container.id)
        if stale:
            log.warning("removed %d sandbox containers left by runs that did not stop cleanly", len(stale))
        return len(stale)

    def storage_driver(self) -> str:
        """The engine's storage driver (`overlay2`, `vfs`, ...)."""
        return str(self.client.info().get("Driver", ""))

    def close(self) -> None:
        self.client.close()
