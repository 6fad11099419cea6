"""Fixtures of the sandbox tests: a real OpenSSH sshd on a loopback port, and the embedded server.

`sshd` (session scope) starts `/usr/sbin/sshd -D` with its own config, host key and
authorized_keys in a temporary directory (`t1.sandbox.ssh.sshd`) and logs in as the current user
(root in CI) with a key generated for the run. `server` is parametrized over both SSH servers and hands each test a
connected `SshSandbox` plus a way to kill the server side of its connection.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.ssh.ssh_sandbox import SshSandbox
from t1.sandbox.ssh.sshd import SSHD, Sshd, SshdProcess, free_port  # noqa: F401  (re-exported to tests)
from t1.sandbox.types import SandboxRequest

SHELL_CFG = ShellConfig(output_cap_bytes=4096, interrupt_grace_s=1.0, keepalive_s=5.0)


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def until(cond: Callable[[], object], timeout_s: float, what: str) -> None:
    """Wait (polling) until `cond()` holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"after {timeout_s:.0f}s: {what}"
        time.sleep(0.05)


def sandbox_tmp_root() -> Path:
    """A directory per-sandbox uids can traverse (pytest's tmp dirs are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="t1-sandbox-test-"))
    path.chmod(0o711)
    return path


@pytest.fixture(scope="session")
def sshd() -> Iterator[Sshd]:
    if not os.access(SSHD, os.X_OK):
        pytest.skip("openssh-server is not installed")
    server = SshdProcess()
    try:
        yield server.start()
    finally:
        server.stop()


@dataclass
class Server:
    """One connected sandbox on a given SSH server, and how to cut it off from the server side."""

    kind: str
    sandbox: SshSandbox
    kill_session: Callable[[], int]
    scratch: str
    """A writable directory in the sandbox for tests to work in."""


@contextlib.asynccontextmanager
async def provider_with(**settings: Any) -> AsyncIterator[LocalProvider]:
    """A local provider with these `LocalProviderConfig` settings over a fresh root, closed and removed after."""
    root = sandbox_tmp_root()
    provider = LocalProvider(LocalProviderConfig(root=root / "trees", **settings), SHELL_CFG)
    try:
        yield provider
    finally:
        await provider.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def local_provider() -> AsyncIterator[LocalProvider]:
    async with provider_with() as provider:
        yield provider


@pytest.fixture(params=["sshd", "embedded"])
async def server(
    request: pytest.FixtureRequest, tmp_path: Path, sshd: Sshd, local_provider: LocalProvider
) -> AsyncIterator[Server]:
    if request.param == "sshd":
        (tmp_path / "remote").mkdir()
        sandbox = await SshSandbox.connect("sshd", sshd.endpoint(), SHELL_CFG)
        try:
            yield Server("sshd", sandbox, sshd.kill_sessions, str(tmp_path / "remote"))
        finally:
            await sandbox.close()
    else:
        box = await local_provider.create(SandboxRequest())
        assert isinstance(box, SshSandbox)
        yield Server("embedded", box, lambda: local_provider.server.drop_connections(box.id), "/app")
