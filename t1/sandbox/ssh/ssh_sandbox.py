"""SshSandbox: one SSH connection to a sandbox (any provider), its shells and SFTP transfers.

A sandbox holds one `asyncssh` connection with keepalives; every agent shell it opens is a
channel on that connection. Verifier shells use a second connection, opened on first use, as the
endpoint's verifier user where the provider has one (the local provider: a uid of its own per
sandbox); without one they share the agent's login and `separates_verifier` is False. When the connection dies, shells
raise `SandboxLost` and
`SshSandbox.alive` turns False, which the pool uses to drop the sandbox.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from t1.config.sandbox import ShellConfig
from t1.sandbox.ssh.ssh_shell import SshShell
from t1.sandbox.ssh.terminal import TerminalShell
from t1.sandbox.types import Sandbox, SandboxHostLost, SandboxLost, SandboxRecord, Shell, ShellRole

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0

CIPHERS = (
    "aes256-gcm@openssh.com",
    "aes128-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-ctr",
)
"""Client cipher preference, AES-GCM first. asyncssh seals a GCM packet with one AEAD call but a
chacha20-poly1305 one with three ChaCha20 setups and a Poly1305 in Python, about a third of the
client's CPU per shell command (bench/shells.py); chacha and CTR stay as fallbacks for servers
without GCM. Never "none": `SshEndpoint` refuses it."""


@dataclass(frozen=True, slots=True)
class SshEndpoint:
    """Where and how to reach a sandbox's SSH server."""

    host: str
    port: int
    user: str
    client_keys: tuple[asyncssh.SSHKey, ...] | tuple[str, ...] = ()
    known_hosts: str | None = None
    """Path of a known_hosts file; None with `insecure=False` uses ~/.ssh/known_hosts."""
    host_keys: tuple[asyncssh.SSHKey, ...] = ()
    """Trusted host keys given directly (the local provider's own server key)."""
    insecure: bool = False
    """Skip host-key verification; only when a config says so explicitly."""
    ciphers: tuple[str, ...] = CIPHERS
    """Encryption algorithms in order of preference (the first the server also offers is used)."""

    def __post_init__(self) -> None:
        if not self.ciphers or "none" in self.ciphers:
            raise ValueError(f"SshEndpoint.ciphers must name real ciphers, got {self.ciphers!r}")


class _LossWatcher(asyncssh.SSHClient):
    def __init__(self) -> None:
        self.lost: Exception | None = None
        self.closed = False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = exc


async def connect(endpoint: SshEndpoint, shell_cfg: ShellConfig) -> tuple[asyncssh.SSHClientConnection, _LossWatcher]:
    """Open the sandbox's SSH connection with keepalives and the endpoint's host verification."""
    if endpoint.insecure:
        known_hosts: object = None
    elif endpoint.host_keys:
        known_hosts = (list(endpoint.host_keys), [], [])
    elif endpoint.known_hosts is not None:
        known_hosts = endpoint.known_hosts
    else:
        known_hosts = ()  # asyncssh default: ~/.ssh/known_hosts
    watcher = _LossWatcher()
    try:
        conn, _ = await asyncssh.create_connection(
            lambda: watcher,
            endpoint.host,
            endpoint.port,
            username=endpoint.user,
            client_keys=list(endpoint.client_keys) or (),
            known_hosts=known_hosts,
            agent_path=None,
            encryption_algs=list(endpoint.ciphers),
            compression_algs=None,  # zlib costs CPU on every packet; commands and outputs are small
            keepalive_interval=shell_cfg.keepalive_s,
            keepalive_count_max=shell_cfg.keepalive_count_max,
            connect_timeout=CONNECT_TIMEOUT_S,
        )
    except (OSError, asyncssh.Error, TimeoutError) as exc:
        raise SandboxLost(f"cannot connect to {endpoint.user}@{endpoint.host}:{endpoint.port}: {exc}") from exc
    return conn, watcher


class SshSandbox:
    """A sandbox reached over one SSH connection; implements the `Sandbox` protocol."""

    def __init__(
        self,
        sandbox_id: str,
        conn: asyncssh.SSHClientConnection,
        watcher: _LossWatcher,
        shell_cfg: ShellConfig,
        endpoint: SshEndpoint,
        verifier: SshEndpoint | None = None,
        on_end_setup: Callable[[], Awaitable[None]] | None = None,
        record: tuple[str, Mapping[str, str]] = ("ssh", {}),
        host_lost: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        self._id = sandbox_id
        self._host_lost = host_lost
        self._record = SandboxRecord(record[0], sandbox_id, dict(record[1]))
        self._on_end_setup = on_end_setup
        self.conn = conn
        self._watcher = watcher
        self._shell_cfg = shell_cfg
        self.endpoint = endpoint
        self._shells: list[SshShell | TerminalShell] = []
        self.verifier_endpoint = verifier
        self._verifier_conn: tuple[asyncssh.SSHClientConnection, _LossWatcher] | None = None

    @classmethod
    async def connect(cls, sandbox_id: str, endpoint: SshEndpoint, shell_cfg: ShellConfig,
                      verifier: SshEndpoint | None = None,
                      on_end_setup: Callable[[], Awaitable[None]] | None = None,
                      record: tuple[str, Mapping[str, str]] = ("ssh", {}),
                      host_lost: Callable[[], Awaitable[str | None]] | None = None) -> SshSandbox:
        """Connect to the sandbox; `record` is its provider's name and data for `record()`; `host_lost` says why
        the process serving it is gone, or None while it runs (`lost_cause`)."""
        conn, watcher = await connect(endpoint, shell_cfg)
        return cls(sandbox_id, conn, watcher, shell_cfg, endpoint, verifier, on_end_setup, record, host_lost)

    async def lost_cause(self, exc: SandboxLost) -> SandboxLost:
        """`exc`, or a SandboxHostLost naming it when the process that served this sandbox (T1's) has died."""
        if self._host_lost is None or isinstance(exc, SandboxHostLost):
            return exc
        why = await self._host_lost()
        return exc if why is None else SandboxHostLost(f"sandbox {self._id}: {why} ({exc})")

    def record(self) -> SandboxRecord:
        """What reattaches this sandbox from another coordinator (`SandboxProvider.reattach`)."""
        return self._record

    async def end_setup(self) -> None:
        """The task's setup is done (`Sandbox.end_setup`): the local provider fixes the system its verifier runs;
        a remote machine has no pristine system to keep (docs/security.md), so there it does nothing."""
        self._check()
        if self._on_end_setup is not None:
            await self._on_end_setup()

    @property
    def separates_verifier(self) -> bool:
        """Whether verifier shells log in as a user of their own (out of the agent's reach)."""
        return self.verifier_endpoint is not None

    async def _connection(self, role: ShellRole) -> asyncssh.SSHClientConnection:
        if role is ShellRole.AGENT or self.verifier_endpoint is None:
            return self.conn
        if self._verifier_conn is None or self._verifier_conn[0].is_closed():
            self._verifier_conn = await connect(self.verifier_endpoint, self._shell_cfg)
        return self._verifier_conn[0]

    @property
    def id(self) -> str:
        return self._id

    @property
    def alive(self) -> bool:
        return not self._watcher.closed and not self.conn.is_closed()

    def _check(self) -> None:
        if not self.alive:
            raise SandboxLost(f"sandbox {self._id}: SSH connection lost: {self._watcher.lost or 'closed'}")

    async def open_shell(self, *, terminal: bool = False, role: ShellRole = ShellRole.AGENT) -> Shell:
        """A new persistent shell (framed bash, or a PTY shell rendered by a terminal emulator) for `role`."""
        self._check()
        conn = await self._connection(role)
        shell: SshShell | TerminalShell
        if terminal:
            shell = await TerminalShell.open(conn, default_timeout_s=self._shell_cfg.command_timeout_s)
        else:
            shell = await SshShell.open(
                conn,
                output_cap_bytes=self._shell_cfg.output_cap_bytes,
                default_timeout_s=self._shell_cfg.command_timeout_s,
                interrupt_grace_s=self._shell_cfg.interrupt_grace_s,
            )
        self._shells.append(shell)
        return shell

    async def exec(self, command: str, timeout_s: float = 60.0) -> asyncssh.SSHCompletedProcess:
        """One-off command on its own channel (health checks, reset commands)."""
        self._check()
        try:
            return await self.conn.run(command, check=False, timeout=timeout_s)
        except (OSError, asyncssh.Error) as exc:
            self._check()
            raise SandboxLost(f"sandbox {self._id}: exec failed: {exc}") from exc

    async def upload(self, local_path: str, remote_path: str) -> None:
        """Copy a local file or directory (recursively) into the sandbox."""
        self._check()
        recurse = Path(local_path).is_dir()
        try:
            async with self.conn.start_sftp_client() as sftp:
                await sftp.put(local_path, remote_path, recurse=recurse, preserve=True)
        except (OSError, asyncssh.Error):
            self._check()
            raise

    async def download(self, remote_path: str, local_path: str) -> None:
        """Copy a file or directory (recursively) out of the sandbox."""
        self._check()
        async with self.conn.start_sftp_client() as sftp:
            recurse = await sftp.isdir(remote_path)
            await sftp.get(remote_path, local_path, recurse=recurse, preserve=True)

    async def close(self) -> None:
        for shell in self._shells:
            try:
                await shell.close()
            except (OSError, asyncssh.Error) as exc:
                log.debug("closing shell of %s: %s", self._id, exc)
        self._shells.clear()
        conns = [self.conn] + ([self._verifier_conn[0]] if self._verifier_conn is not None else [])
        for conn in conns:
            conn.close()
            with contextlib.suppress(OSError, asyncssh.Error):
                await conn.wait_closed()


async def lost_cause(sandbox: Sandbox, exc: SandboxLost) -> SandboxLost:
    """Why `sandbox` was lost: SandboxHostLost when T1's process serving it died (`SshSandbox.lost_cause`), else
    `exc`."""
    return await sandbox.lost_cause(exc) if isinstance(sandbox, SshSandbox) else exc
