"""Config of the sandbox plane: providers, the pool and shell limits."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from t1.config.base import Section


class ShellConfig(Section):
    """Limits applied to every command run in a sandbox shell."""

    command_timeout_s: float = Field(180.0, gt=0, description="Default per-command timeout.")
    output_cap_bytes: int = Field(16384, ge=256, description="Observation cap; head and tail are kept.")
    interrupt_grace_s: float = Field(2.0, ge=0, description="Wait after SIGINT before killing the job.")
    keepalive_s: float = Field(30.0, gt=0, description=(
        "SSH keepalive interval: a probe after this long without a packet from the sandbox (each is a wake-up of "
        "the coordinator per idle sandbox: 333 a second at 10,000 sandboxes)."))
    keepalive_count_max: int = Field(3, ge=1, description="Missed keepalives before the connection is lost.")


class LimitsConfig(Section):
    """Resource limits inside local sandboxes."""

    max_processes: int = Field(512, ge=16, description="Processes per sandbox (RLIMIT_NPROC and the sandbox's pids "
                                                       "cgroup).")
    max_file_mb: int | None = Field(None, ge=1, description="RLIMIT_FSIZE in MiB; null: none, as in a container (space "
                                                            "is bounded by storage, and a size cap fails sparse and "
                                                            "preallocated files).")
    max_memory_mb: int | None = Field(4096, ge=64, description="Address-space limit in MiB where the kernel allows; "
                                                               "null disables.")
    sandbox_memory_mb: int = Field(4096, ge=64, description="Memory of a whole sandbox (cgroup) when its task sets no "
                                                            "memory_mb.")
    sandbox_cpus: float = Field(2.0, gt=0, description="CPU quota of a whole sandbox in cores when its task sets no "
                                                       "cpus.")


class LocalProviderConfig(Section):
    """The embedded SSH server whose sessions run in bubblewrap."""

    root: Path = Field(Path(".t1/sandboxes"), description="Where sandbox trees are created.")
    host: str = Field("127.0.0.1", description="Loopback address of the embedded SSH server.")
    port: int = Field(0, ge=0, le=65535, description="Port of the embedded SSH server; 0 picks one.")
    bubblewrap: bool = Field(True, description="Isolate sessions with bubblewrap (off only for debugging: no overlay, "
                                               "no isolation).")
    overlay: bool = Field(True, description="A copy-on-write root over the host's per sandbox, writable anywhere, as "
                                            "in a container (needs T1 running as root; otherwise the system is "
                                            "read-only); the verifier runs the system as the task's setup left it "
                                            "(docs/security.md). Off: the host's system, read-only.")
    storage_mb: int = Field(10240, ge=16, description="A sandbox's writable storage (tmpfs, used as written) when its "
                                                      "task names none; overlay only.")
    max_storage_mb: int = Field(102400, ge=16, description="The most storage a task may ask for; a larger request is "
                                                           "refused.")
    verifier_storage_mb: int = Field(1024, ge=16, description="Size of each of the verifier's own tmpfs dirs in an "
                                                              "overlay sandbox (/tests, /logs/verifier, its "
                                                              "toolchain): a sandbox the agent filled does not stop "
                                                              "its verifier.")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Resource limits.")
    service: bool = Field(True, description="In a coordinator's run: the SSH server and the sandboxes' namespace "
                                            "holders run in a sandbox service process of their own, which outlives the "
                                            "coordinator (a restarted coordinator of the same run dir reattaches its "
                                            "sandboxes). Off: they live in the coordinator's process and die with it.")
    service_grace_s: float = Field(600.0, gt=0, description="How long the sandbox service waits for a coordinator to "
                                                            "attach (after its start, or after the last one's "
                                                            "connection closed, kill -9 included) before it destroys "
                                                            "every sandbox and exits; it waits on while a process "
                                                            "holds the run dir's lock (a coordinator still starting).")

    @model_validator(mode="after")
    def _storage_fits(self) -> LocalProviderConfig:
        if self.storage_mb > self.max_storage_mb:
            raise ValueError(f"storage_mb {self.storage_mb} is above max_storage_mb {self.max_storage_mb}")
        return self


class SshHost(Section):
    """One host of the fixed SSH inventory."""

    host: str = Field(..., description="Address or name.")
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    user: str = Field("root", description="Login user.")


class SshProviderConfig(Section):
    """A fixed inventory of hosts (cloud VMs)."""

    hosts: list[SshHost] = Field(default_factory=list, description="The inventory.")
    key_file: Path | None = Field(None, description="Private key for every host.")
    known_hosts: Path | None = Field(None, description="known_hosts file used for host verification.")
    insecure_skip_host_verification: bool = Field(False, description="Explicitly turn host-key verification off.")
    reset_command: str = Field("rm -rf /app/* /logs/* /tests/* 2>/dev/null; true", description="Run between tasks.")


class CommandProviderConfig(Section):
    """Create and destroy sandboxes with external commands (cloud CLIs)."""

    create: list[str] = Field(default_factory=list, description="argv printing JSON {host, port, user, key_file, id}.")
    destroy: list[str] = Field(default_factory=list, description="argv; '{id}' is replaced by the sandbox id.")
    known_hosts: Path | None = Field(None, description="known_hosts for created hosts.")
    insecure_skip_host_verification: bool = Field(False, description="Explicitly turn host-key verification off.")
    timeout_s: float = Field(900.0, gt=0, description="Longest a create or destroy command may run.")


class DockerProviderConfig(Section):
    """Containers from the task's image on a Docker engine, entered by the embedded SSH server (docs/docker.md)."""

    socket: Path = Field(Path("/var/run/docker.sock"), description="Unix socket of the Docker engine's API.")
    default_image: str = Field("t1-test-base:latest", description="Image of a task that names no docker_image.")
    pull: bool = Field(False, description="Pull an image the engine lacks (off: a missing image is a needs_image "
                                          "report).")
    host: str = Field("127.0.0.1", description="Loopback address of the embedded SSH server.")
    port: int = Field(0, ge=0, le=65535, description="Port of the embedded SSH server; 0 picks one.")
    memory_mb: int = Field(4096, ge=16, description="Memory of a container when its task sets no memory_mb.")
    cpus: float = Field(2.0, gt=0, description="CPU quota of a container in cores when its task sets no cpus.")
    pids: int = Field(512, ge=16, description="Processes per container (the engine's pids limit).")
    internet_network: str | None = Field(None, description="Engine network for tasks that allow the internet, one the "
                                                           "operator made so it cannot reach the host or T1's "
                                                           "services; null: such tasks get a needs_network report.")
    start_timeout_s: float = Field(60.0, gt=0, description="Longest a container may take to be running.")
    build: bool = Field(True, description="Build a task's environment/Dockerfile with the engine (cached as "
                                          "t1-env:<digest>) when it names no docker_image; off: start from "
                                          "default_image and replay the Dockerfile in the container.")
    build_timeout_s: float = Field(1800.0, gt=0, description="Longest one environment build may take.")
    verifier_tmpfs_mb: int = Field(1024, ge=16, description="Size of each of the verifier's tmpfs dirs in a container "
                                                            "(/tests, /logs/verifier, its toolchain).")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Per-process limits of every session.")


class PoolConfig(Section):
    """Bounded acquisition of sandboxes."""

    max_sandboxes: int = Field(64, ge=1, description="Most sandboxes alive at once.")
    acquire_timeout_s: float = Field(600.0, gt=0, description="Wait for a free sandbox before failing.")
    create_retries: int = Field(3, ge=0, description="Retries of a failed create, with backoff.")
    backoff_s: float = Field(1.0, ge=0, description="First backoff; doubles per retry.")
    max_creates_per_s: float = Field(20.0, gt=0, description="Cap on the creation rate.")
    quarantine_after: int = Field(3, ge=1, description="Consecutive failures before a host is quarantined.")
    quarantine_s: float = Field(300.0, ge=0, description="How long a host stays quarantined.")
    health_check: bool = Field(True, description="Run a trivial command on every new sandbox before handing it out.")
    health_check_timeout_s: float = Field(30.0, gt=0, description="Deadline of that health check.")


class SandboxConfig(Section):
    """Where episodes run their shells."""

    provider: Literal["local", "ssh", "command", "docker"] = Field("local", description="Which provider creates "
                                                                                        "sandboxes.")
    local: LocalProviderConfig = Field(default_factory=LocalProviderConfig, description="Local provider settings.")
    ssh: SshProviderConfig = Field(default_factory=SshProviderConfig, description="SSH inventory settings.")
    command: CommandProviderConfig = Field(default_factory=CommandProviderConfig, description="Command provider "
                                                                                              "settings.")
    docker: DockerProviderConfig = Field(default_factory=DockerProviderConfig, description="Docker provider settings.")
    pool: PoolConfig = Field(default_factory=PoolConfig, description="Pool settings.")
    shell: ShellConfig = Field(default_factory=ShellConfig, description="Shell limits.")

    @model_validator(mode="after")
    def _provider_configured(self) -> SandboxConfig:
        if self.provider == "ssh" and not self.ssh.hosts:
            raise ValueError("provider 'ssh' needs at least one entry in ssh.hosts")
        if self.provider == "command" and not self.command.create:
            raise ValueError("provider 'command' needs command.create")
        return self
