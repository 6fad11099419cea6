"""`build_provider(cfg)`: the sandbox provider a config names (local, ssh, command or docker)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from t1.config.sandbox import SandboxConfig
from t1.sandbox.types import SandboxProvider

if TYPE_CHECKING:
    from t1.sandbox.docker.docker_provider import ImageBuilder


def build_provider(
    cfg: SandboxConfig, run_dir: Path | None = None, images: ImageBuilder | None = None
) -> SandboxProvider:
    """Construct (not start) the provider of `cfg.provider`; the local one starts its server on first create.
    With `run_dir` (a coordinator's) its sandboxes outlive the coordinator: local ones live in the run's sandbox
    service (`t1.sandbox.local.service`), docker ones are labelled with the run; both reattach into it.
    `images` builds tasks' Dockerfile environments for the docker provider (`t1.tasks.image.docker_build`)."""
    if cfg.provider == "local":
        from t1.sandbox.local.local_provider import LocalProvider

        return LocalProvider(cfg.local, cfg.shell, run_dir)
    if cfg.provider == "ssh":
        from t1.sandbox.ssh.remote import SshProvider

        return SshProvider(cfg.ssh, cfg.shell)
    if cfg.provider == "command":
        from t1.sandbox.ssh.remote import CommandProvider

        return CommandProvider(cfg.command, cfg.shell)
    if cfg.provider == "docker":
        from t1.sandbox.docker.docker_provider import DockerProvider

        return DockerProvider(cfg.docker, cfg.shell, run_dir, images)
    raise ValueError(f"sandbox.provider: unknown provider {cfg.provider!r} (expected local, ssh, command or docker)")


def start_ahead(cfg: SandboxConfig, run_dir: Path) -> None:
    """Start the run's sandbox service now, where the provider will want one (local, `sandbox.local.service`), so
    its start (a process's imports, the host scan) overlaps the coordinator's; the provider attaches to it later."""
    if cfg.provider == "local" and cfg.local.service:
        from t1.sandbox.local.service_client import spawn_service

        spawn_service(cfg.local, run_dir)


async def stop_ahead(cfg: SandboxConfig, run_dir: Path) -> None:
    """The end of a coordinator: a service `start_ahead` started that no provider took over and that holds no
    sandbox is shut down (`t1.sandbox.local.service_client.stop_spawned`)."""
    if cfg.provider == "local" and cfg.local.service:
        from t1.sandbox.local.service_client import stop_spawned

        await stop_spawned(cfg.local, run_dir)
