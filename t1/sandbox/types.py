"""The seams of the sandbox plane: command results, shells, sandboxes and their providers."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol, runtime_checkable

from t1.errors import InfraError


class SandboxLost(InfraError):
    """The sandbox or its connection is gone; the episode cannot continue in it (an infra error)."""


class SandboxHostLost(SandboxLost):
    """The process that served the sandbox, one of T1's own (the local sandbox service), died: the sandbox was
    lost with it, which is never the attempt's doing (`t1.tasks.verify.outcome`: an infra error)."""


class SandboxGone(SandboxLost):
    """A sandbox a record names cannot be reattached: destroyed, swept, of another run, or its provider's
    sandboxes do not outlive their coordinator. The message names which."""


@dataclass(frozen=True, slots=True)
class SandboxRecord:
    """What a later coordinator needs to reattach a live sandbox (`SandboxProvider.reattach`).

    `data` is the provider's own, strings only, so the record is JSON as it stands
    (`dataclasses.asdict` / `SandboxRecord.from_json`): a container id, an inventory host, an endpoint.
    """

    provider: str
    sandbox_id: str
    data: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"provider": self.provider, "sandbox_id": self.sandbox_id, "data": dict(self.data)}

    @classmethod
    def from_json(cls, obj: object) -> SandboxRecord:
        """The record `to_json` wrote; a ValueError names what is missing or of the wrong type."""
        if not isinstance(obj, dict):
            raise ValueError(f"sandbox record: expected a JSON object, got {type(obj).__name__}")
        provider, sandbox_id, data = obj.get("provider"), obj.get("sandbox_id"), obj.get("data", {})
        if not isinstance(provider, str) or not provider:
            raise ValueError(f"sandbox record: 'provider' must be a non-empty string, got {provider!r}")
        if not isinstance(sandbox_id, str) or not sandbox_id:
            raise ValueError(f"sandbox record: 'sandbox_id' must be a non-empty string, got {sandbox_id!r}")
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise ValueError(f"sandbox record of {sandbox_id}: 'data' must map strings to strings, got {data!r}")
        return cls(provider, sandbox_id, dict(data))


class ShellRole(StrEnum):
    """Whose shell: the agent's, or the verifier's (out of the agent's reach where the provider can do it).

    On the local provider a verifier shell runs as a uid of its own per sandbox (mapped in the
    sandbox's user namespace next to the agent's root), in the same filesystem view, PID and
    network namespaces as the agent (tests reach servers the agent started): agent processes can
    neither signal nor trace it, and /tests, /logs/verifier and the verifier toolchain are
    writable (and /tests readable) only by it. Providers that cannot separate the roles log in as
    the same user and say so (`SshSandbox.separates_verifier`); see docs/security.md.
    """

    AGENT = "agent"
    VERIFIER = "verifier"


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one command did: capped output, exit code, and how it ended."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    shell_restarted: bool = False
    output_bytes: int = 0


@runtime_checkable
class Shell(Protocol):
    """A long-lived shell whose cwd, environment and jobs persist from command to command."""

    async def run(self, command: str, timeout_s: float | None = None) -> CommandResult: ...

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_from(self, local: Path, path: str, mode: int = 0o644) -> None:
        """Copy the host file `local` to `path` in the sandbox, streamed (memory bounded whatever its size)."""
        ...

    async def read_to(self, path: str, local: Path) -> int:
        """Copy the sandbox file `path` to the host file `local`, streamed; returns its bytes."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class Terminal(Shell, Protocol):
    """A shell on a PTY, driven by keystrokes and read as a rendered screen (Terminus-2 style)."""

    async def send_keys(self, keys: str | Iterable[str]) -> None:
        """Type text and tmux-style key names (`C-c`, `C-d`, `Escape`, `Up`, `Enter`, ...)."""
        ...

    def screen(self) -> str: ...

    async def keystrokes(self, keys: str | Iterable[str], duration_s: float = 1.0) -> str:
        """Send keys, wait `duration_s`, return the screen."""
        ...


BUILT_MARKER = "/run/t1-environment.json"
"""In a sandbox whose provider built its image from the task's Dockerfile (`SandboxRequest.build_context`):
JSON {"image", "workdir", "env", "user"} of that image, which provisioning applies instead of replaying it."""


@dataclass(frozen=True, slots=True)
class SandboxRequest:
    """What a task asks of its sandbox."""

    allow_network: bool = False
    docker_image: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    """Writable storage the task needs (Harbor's `storage_mb`); the provider's default when None."""
    env: tuple[tuple[str, str], ...] = field(default=())
    build_context: Path | None = None
    """The task's environment/ folder when its Dockerfile makes the image (no docker_image): a provider that
    builds images (docker) builds the sandbox's image from it; the others replay the Dockerfile in the sandbox."""


@runtime_checkable
class Sandbox(Protocol):
    """One isolated machine (or tree) with an SSH endpoint."""

    @property
    def id(self) -> str: ...

    async def open_shell(self, *, terminal: bool = False, role: ShellRole = ShellRole.AGENT) -> Shell: ...

    async def end_setup(self) -> None:
        """The task's setup is done and the agent has not acted yet: call once, between the two.

        Where the provider can (local overlay sandboxes), the system that verifier shells run is
        fixed as it is now: later writes by the agent to system dirs never reach the verifier.
        """
        ...

    async def upload(self, local_path: str, remote_path: str) -> None: ...

    async def download(self, remote_path: str, local_path: str) -> None: ...

    def record(self) -> SandboxRecord:
        """What reattaches this sandbox from another coordinator (`SandboxProvider.reattach`)."""
        ...


@dataclass(frozen=True, slots=True)
class SandboxTraits:
    """What a provider's sandboxes can do, which decides how a task is set up and verified in them."""

    no_images: bool  # tasks cannot start from their image: the Dockerfile is replayed in the sandbox
    offline: bool    # sandboxes never reach the internet: verifiers get no downloads either


LOCAL_TRAITS = SandboxTraits(no_images=True, offline=True)
"""Trees over the host's root with no network (the local provider): Dockerfiles are replayed, installs are offline."""
IMAGE_TRAITS = SandboxTraits(no_images=False, offline=False)
"""Sandboxes that start from the task's image, online where the task allows (docker, ssh, command)."""


@runtime_checkable
class SandboxProvider(Protocol):
    """Creates, destroys and reattaches sandboxes.

    `survives_coordinator`: whether a sandbox outlives the coordinator process that created it
    (kill -9 included), so that a restarted coordinator can `reattach` it from its `record()`.
    `traits`: what its sandboxes can do (images, internet), which decides how tasks are provisioned.
    """

    @property
    def survives_coordinator(self) -> bool: ...

    @property
    def traits(self) -> SandboxTraits: ...

    async def create(self, request: SandboxRequest) -> Sandbox: ...

    async def reattach(self, record: SandboxRecord) -> Sandbox:
        """The live sandbox `record` names, with a new connection: its files and processes as they were
        (shells are new). Raises SandboxGone naming why when it no longer exists or is not this run's."""
        ...

    async def destroy(self, sandbox: Sandbox) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class SweepsUnclaimed(Protocol):
    """A provider whose sandboxes outlive their coordinator and that can find those of its run (local with the
    sandbox service, docker)."""

    async def sweep_unclaimed(self, keep: Collection[str] = ()) -> int:
        """Destroy the sandboxes of this run that earlier coordinators made, this provider has not reattached
        and `keep` does not name (ids of sandboxes a restarted coordinator will still reattach); how many."""
        ...
