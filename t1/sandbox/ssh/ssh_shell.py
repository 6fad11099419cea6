"""SshShell: a persistent framed bash over one SSH channel, with timeouts, output caps and restarts.

Each `run` writes one framed command to the supervisor (see `t1.sandbox.ssh.framing`) and waits for
its frame; output arrives through `data_received` and is capped as it streams, so a command that
prints gigabytes costs only the cap in memory. On timeout the command's processes get SIGINT,
then SIGKILL, and if the worker still does not answer the shell is restarted (same cwd) and the
result says so. A lost SSH connection raises `SandboxLost`; a worker that died (`exit`,
`kill -9 $$`, `exec false`) is replaced and the result carries `shell_restarted=True`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import asyncssh

from t1.sandbox.ssh import framing
from t1.sandbox.types import CommandResult, SandboxLost

log = logging.getLogger(__name__)

KILL_GRACE_S = 2.0
START_TIMEOUT_S = 30.0


class _FramedSession(asyncssh.SSHClientSession[bytes]):
    """Feeds channel bytes to the scanner and wakes the waiting command on a frame or channel end.

    The waiter is a bare future rather than an `asyncio.Event` under `wait_for`: on Python 3.11
    `wait_for` wraps the wait in a new Task, which costs loop iterations on every command.
    """

    def __init__(self, scanner: framing.FrameScanner) -> None:
        self.scanner = scanner
        self.waiter: asyncio.Future[bool] | None = None
        self.closed = False
        self.lost: Exception | None = None
        self.error: Exception | None = None

    @property
    def done(self) -> bool:
        """A frame arrived, the stream broke the protocol, or the channel ended."""
        return self.scanner.frame is not None or self.error is not None or self.closed

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        try:
            self.scanner.feed(data)
        except ValueError as exc:
            self.error = exc
        if self.scanner.frame is not None or self.error is not None:
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = exc
        self._wake()

    async def wait(self, timeout: float) -> bool:
        """True when `done` within `timeout` seconds."""
        if self.done:
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        timer = loop.call_later(timeout, _expire, waiter)
        self.waiter = waiter
        try:
            return await waiter
        finally:
            timer.cancel()
            self.waiter = None


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


TRANSFER_CHUNK = 1 << 20
"""Bytes per step of a streamed file transfer (`write_from`, `read_to`): what one holds in memory."""


class SftpFiles:
    """`write_file`/`read_file` over one lazily started SFTP client on the shell's connection."""

    _conn: asyncssh.SSHClientConnection
    _sftp: asyncssh.SFTPClient | None

    def _raise_if_connection_lost(self) -> None:
        if self._conn.is_closed():
            raise SandboxLost("SSH connection lost")

    async def _sftp_client(self) -> asyncssh.SFTPClient:
        if self._sftp is None:
            self._raise_if_connection_lost()
            try:
                self._sftp = await self._conn.start_sftp_client()
            except (OSError, asyncssh.Error) as exc:
                self._raise_if_connection_lost()
                raise SandboxLost(f"cannot start SFTP: {exc}") from exc
        return self._sftp

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write `data` to `path` in the sandbox over SFTP (parent directories must exist)."""
        sftp = await self._sftp_client()
        async with sftp.open(path, "wb") as f:
            await f.write(data)
        await sftp.chmod(path, mode)

    async def read_file(self, path: str) -> bytes:
        """Read a whole file from the sandbox over SFTP."""
        sftp = await self._sftp_client()
        async with sftp.open(path, "rb") as f:
            data: bytes = await f.read()
        return data

    async def write_from(self, local: Path, path: str, mode: int = 0o644) -> None:
        """Copy a host file to `path` over SFTP, TRANSFER_CHUNK bytes at a time (parent directories must exist)."""
        sftp = await self._sftp_client()
        with local.open("rb") as src:
            async with sftp.open(path, "wb") as f:
                while chunk := src.read(TRANSFER_CHUNK):
                    await f.write(chunk)
        await sftp.chmod(path, mode)

    async def read_to(self, path: str, local: Path) -> int:
        """Copy `path` to a host file over SFTP, TRANSFER_CHUNK bytes at a time; returns its bytes."""
        sftp = await self._sftp_client()
        size = 0
        async with sftp.open(path, "rb") as f:
            with local.open("wb") as out:
                while True:
                    chunk: bytes = await f.read(TRANSFER_CHUNK)
                    if not chunk:
                        break
                    out.write(chunk)
                    size += len(chunk)
        return size


class SshShell(SftpFiles):
    """One persistent `bash --noprofile --norc` over SSH; see the module docstring for the protocol."""

    def __init__(
        self,
        conn: asyncssh.SSHClientConnection,
        *,
        output_cap_bytes: int = 16384,
        default_timeout_s: float = 180.0,
        interrupt_grace_s: float = 2.0,
    ) -> None:
        self._conn = conn
        self._cap = output_cap_bytes
        self._default_timeout_s = default_timeout_s
        self._grace_s = interrupt_grace_s
        self._token = framing.Token.new()
        self._lock = asyncio.Lock()
        self._chan: asyncssh.SSHClientChannel[bytes] | None = None
        self._session: _FramedSession | None = None
        self._cwd: str | None = None
        self._sftp: asyncssh.SFTPClient | None = None
        self._closed = False
        self._in_flight = False
        self.num_restarts = 0

    @classmethod
    async def open(cls, conn: asyncssh.SSHClientConnection, **kwargs: Any) -> SshShell:
        shell = cls(conn, **kwargs)
        await shell._start()
        return shell

    @property
    def cwd(self) -> str | None:
        """The worker's cwd after the last command (shell-quoted, as `printf %q` wrote it)."""
        return self._cwd

    async def _start(self) -> None:
        scanner = framing.FrameScanner(self._token, self._cap)
        try:
            chan, session = await self._conn.create_session(
                lambda: _FramedSession(scanner), framing.supervisor_command(), encoding=None
            )
        except (OSError, asyncssh.Error) as exc:
            raise SandboxLost(f"cannot open a shell channel: {exc}") from exc
        assert isinstance(session, _FramedSession)
        self._chan, self._session = chan, session
        chan.write(framing.token_message(self._token) + framing.worker_message(framing.init_body(self._cwd)))
        if not await session.wait(START_TIMEOUT_S):
            chan.abort()
            raise SandboxLost(f"the remote shell did not start within {START_TIMEOUT_S:.0f}s") from None
        frame = scanner.frame
        if frame is None or frame.worker_died:
            self._raise_if_connection_lost()
            raise SandboxLost(f"the remote shell exited while starting: {scanner.output.render()!r}")
        self._cwd = frame.cwd

    def _raise_if_connection_lost(self) -> None:
        session = self._session
        if self._conn.is_closed() or (session is not None and session.lost is not None):
            lost = session.lost if session is not None else None
            raise SandboxLost(f"SSH connection lost: {lost or 'closed'}")

    async def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        """Run `command` in the persistent shell; never raises for what the command does, only for a lost sandbox."""
        if self._closed:
            raise RuntimeError("run() on a closed shell")
        timeout = self._default_timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout}")
        framing.command_body(command)  # reject bad commands before touching the shell
        async with self._lock:
            return await self._run_locked(command, timeout)

    async def _run_locked(self, command: str, timeout: float) -> CommandResult:
        self._raise_if_connection_lost()
        assert self._chan is not None and self._session is not None
        restarted = False
        # The shell died between commands (a background `kill $PPID`), or a cancelled run() left a
        # command whose frame would otherwise be taken for the next one's: start afresh.
        if self._session.closed or self._in_flight:
            await self._restart()
            restarted = True
        session, scanner = self._session, self._session.scanner
        scanner.reset()
        start = time.monotonic()
        self._in_flight = True
        self._send(framing.worker_message(framing.command_body(command)))
        timed_out = not await session.wait(timeout)
        if timed_out:
            for message, grace in ((b"I\n", self._grace_s), (b"K\n", KILL_GRACE_S)):
                self._send(message)
                if await session.wait(grace):
                    break
        self._in_flight = False
        if session.error is not None:
            raise SandboxLost(f"remote shell protocol error: {session.error}")
        frame = scanner.frame
        output = scanner.output
        if frame is None or frame.worker_died:
            self._raise_if_connection_lost()
            await self._restart()
            restarted = True
        else:
            self._cwd = frame.cwd
        return CommandResult(
            output=output.render(),
            exit_code=None if frame is None else frame.exit_code,
            timed_out=timed_out,
            truncated=output.truncated,
            duration_s=time.monotonic() - start,
            shell_restarted=restarted,
            output_bytes=output.total_bytes,
        )

    def _send(self, data: bytes) -> None:
        assert self._chan is not None
        try:
            self._chan.write(data)
        except (OSError, asyncssh.Error, BrokenPipeError):
            self._raise_if_connection_lost()

    async def _restart(self) -> None:
        """Kill what is left of the old shell and start a new one in the last known cwd."""
        self.num_restarts += 1
        log.info("restarting remote shell (restart %d)", self.num_restarts)
        if self._chan is not None and self._session is not None and not self._session.closed:
            try:
                self._chan.write(b"R\n")
                self._chan.write_eof()
            except (OSError, asyncssh.Error):
                pass
            self._chan.close()
        self._token = framing.Token.new()
        self._in_flight = False
        await self._start()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._sftp is not None:
            self._sftp.exit()
        if self._chan is not None and self._session is not None and not self._session.closed:
            try:
                self._chan.write(b"R\n")
                self._chan.write_eof()
            except (OSError, asyncssh.Error):
                pass
            self._chan.close()
