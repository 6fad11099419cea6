"""The hostile-shell suite (tests/sandbox/test_shell.py) against sandboxes of the docker provider.

The suite's tests are collected here a second time with `server` a docker sandbox: framing,
timeouts, restarts, capped output, SFTP, lost connections and terminal mode must hold the same, and a
command that scans every process's memory for the supervisor's token finds none to forge a frame with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from private_dockerd import PrivateDockerd, docker_config
from sandbox.conftest import SHELL_CFG, Server
from sandbox.test_shell import *  # noqa: F403  (the suite, collected again with the fixture below)
from sandbox.test_unforgeable_frames import test_fake_frames_do_not_end_the_command  # noqa: F401  (memory scanned)

from t1.sandbox.docker.docker_provider import DockerProvider
from t1.sandbox.ssh.ssh_sandbox import SshSandbox
from t1.sandbox.types import SandboxRequest


@pytest.fixture
async def server(dockerd: PrivateDockerd) -> AsyncIterator[Server]:
    provider = DockerProvider(docker_config(dockerd, memory_mb=512, pids=256), SHELL_CFG)
    try:
        box = await provider.create(SandboxRequest())
        assert isinstance(box, SshSandbox)
        yield Server("docker", box, lambda: provider.server.drop_connections(box.id), "/app")
    finally:
        await provider.close()
