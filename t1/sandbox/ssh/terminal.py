"""TerminalShell: an interactive bash on a PTY whose screen is rendered by pyte.

For programs that need a TTY (editors, pagers, REPLs) and for the Terminus-2 keystroke protocol:
`send_keys` types text and named keys (tmux names: `C-c`, `C-d`, `Escape`, `Up`, `Enter`, ...),
`screen()` returns what a person would see, and `keystrokes(keys, duration_s)` does both with the
wait in between. `run` (the `Shell` protocol) types a command followed by a split-token frame and
returns the screen once the frame arrives or the timeout passes (then it sends C-c).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shlex
import time
from collections.abc import Iterable
from typing import Any

import asyncssh
import pyte

from t1.sandbox.ssh import framing
from t1.sandbox.ssh.ssh_shell import SftpFiles
from t1.sandbox.types import CommandResult, SandboxLost

log = logging.getLogger(__name__)

NAMED_KEYS: dict[str, bytes] = {
    "Enter": b"\r", "Tab": b"\t", "Space": b" ", "BSpace": b"\x7f", "Escape": b"\x1b", "Esc": b"\x1b",
    "Up": b"\x1b[A", "Down": b"\x1b[B", "Right": b"\x1b[C", "Left": b"\x1b[D",
    "Home": b"\x1b[H", "End": b"\x1b[F", "PageUp": b"\x1b[5~", "PPage": b"\x1b[5~",
    "PageDown": b"\x1b[6~", "NPage": b"\x1b[6~", "DC": b"\x1b[3~", "Delete": b"\x1b[3~",
}
_CTRL_RE = re.compile(r"^C-([a-zA-Z@\[\\\]^_])$")
_META_RE = re.compile(r"^M-(.)$")
_STATUS_RE = re.compile(rb"(-?\d+)\x07")
STARTUP_TIMEOUT_S = 30.0


def prompt_frame_command(token: framing.Token) -> str:
    """Start an interactive bash whose every prompt emits an invisible OSC frame with `$?`."""
    prompt_command = f"printf '\\033]777;%s%s;%d\\007' {token.left} {token.right} \"$?\""
    return f"exec env PS1='$ ' PROMPT_COMMAND={shlex.quote(prompt_command)} bash --noprofile --norc -i"


def frame_marker(token: framing.Token) -> bytes:
    return b"\x1b]777;" + (token.left + token.right).encode() + b";"


def key_bytes(key: str) -> bytes:
    """Bytes a terminal sends for one tmux-style key name; anything else is literal text."""
    if key in NAMED_KEYS:
        return NAMED_KEYS[key]
    if m := _CTRL_RE.match(key):
        return bytes([ord(m.group(1).upper()) & 0x1F])
    if m := _META_RE.match(key):
        return b"\x1b" + m.group(1).encode()
    return key.encode()


class _Screen(pyte.Screen):
    """pyte's screen, tolerant of private SGR sequences (`CSI > ... m`) that it does not model."""

    def select_graphic_rendition(self, *attrs: int, private: bool = False, **_: Any) -> None:
        if not private:
            super().select_graphic_rendition(*attrs)


class _PtySession(asyncssh.SSHClientSession[bytes]):
    def __init__(self, cols: int, rows: int) -> None:
        self.screen = _Screen(cols, rows)
        self.render_errors = 0
        self.stream = pyte.ByteStream(self.screen)
        self.recent = bytearray()
        self.changed = asyncio.Event()
        self.closed = False

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        try:
            self.stream.feed(data)
        except Exception:  # a rendering bug must not take the SSH connection down with it
            self.render_errors += 1
            log.warning("terminal emulator failed on %d bytes of output", len(data), exc_info=True)
        self.recent += data
        if len(self.recent) > 65536:
            del self.recent[:-8192]
        self.changed.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.changed.set()


class TerminalShell(SftpFiles):
    """An interactive bash on a PTY (`TERM=xterm`), screen rendered with pyte."""

    def __init__(self, conn: asyncssh.SSHClientConnection, cols: int, rows: int, default_timeout_s: float) -> None:
        self._conn = conn
        self._sftp = None
        self.cols, self.rows = cols, rows
        self._default_timeout_s = default_timeout_s
        self._token = framing.Token.new()
        self._chan: asyncssh.SSHClientChannel[bytes] | None = None
        self._session: _PtySession | None = None
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, conn: asyncssh.SSHClientConnection, *, cols: int = 160, rows: int = 48,
                   default_timeout_s: float = 180.0, **_: Any) -> TerminalShell:
        shell = cls(conn, cols, rows, default_timeout_s)
        try:
            chan, session = await conn.create_session(
                lambda: _PtySession(cols, rows),
                prompt_frame_command(shell._token),
                request_pty="force", term_type="xterm", term_size=(cols, rows), encoding=None,
            )
        except (OSError, asyncssh.Error) as exc:
            raise SandboxLost(f"cannot open a terminal channel: {exc}") from exc
        assert isinstance(session, _PtySession)
        shell._chan, shell._session = chan, session
        if await shell._wait_frame(time.monotonic() + STARTUP_TIMEOUT_S) is None:
            chan.close()
            raise SandboxLost(f"the terminal shell showed no prompt within {STARTUP_TIMEOUT_S:.0f}s")
        return shell

    @staticmethod
    async def _settle(session: _PtySession, quiet_s: float = 0.1, max_s: float = 1.0) -> None:
        """Let output from earlier keystrokes (and its prompt frames) arrive before a new command."""
        deadline = time.monotonic() + max_s
        while time.monotonic() < deadline:
            session.changed.clear()
            try:
                await asyncio.wait_for(session.changed.wait(), quiet_s)
            except TimeoutError:
                return

    async def _wait_frame(self, deadline: float, after: bytes = b"") -> int | None:
        """Exit status from the next prompt frame (past the echo of `after`, when given), or None
        at the deadline or channel end. Waiting for the echo first skips a prompt frame that was
        still in flight from earlier keystrokes (the prompt after a program exited)."""
        session = self._session
        assert session is not None
        marker = frame_marker(self._token)
        while True:
            if after and (echo := session.recent.find(after)) >= 0:
                del session.recent[: echo + len(after)]
                after = b""
            idx = -1 if after else session.recent.find(marker)
            if idx >= 0 and (m := _STATUS_RE.match(session.recent, idx + len(marker))):
                return int(m.group(1))
            remaining = deadline - time.monotonic()
            if remaining <= 0 or session.closed:
                return None
            session.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(session.changed.wait(), remaining)

    def _live(self) -> tuple[asyncssh.SSHClientChannel[bytes], _PtySession]:
        if self._chan is None or self._session is None:
            raise RuntimeError("terminal shell is not open")
        if self._session.closed:
            self._raise_if_connection_lost()
            raise SandboxLost("the terminal session ended")
        return self._chan, self._session

    async def send_keys(self, keys: str | Iterable[str]) -> None:
        """Type keys: a single string, or a list of strings and tmux key names."""
        chan, _ = self._live()
        for key in [keys] if isinstance(keys, str) else keys:
            chan.write(key_bytes(key))

    def screen(self) -> str:
        """The current screen, one line per row, trailing blanks removed."""
        _, session = self._live()
        return "\n".join(line.rstrip() for line in session.screen.display).rstrip("\n")

    async def keystrokes(self, keys: str | Iterable[str], duration_s: float = 1.0) -> str:
        """Terminus-2 step: send keys, wait `duration_s`, return the screen."""
        await self.send_keys(keys)
        await asyncio.sleep(duration_s)
        return self.screen()

    async def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        """Type a command line and wait for its frame; the observation is the rendered screen."""
        timeout = self._default_timeout_s if timeout_s is None else timeout_s
        if "\n" in command.rstrip("\n"):
            raise ValueError("terminal run() takes one command line; send multi-line input with send_keys")
        async with self._lock:
            chan, session = self._live()
            start = time.monotonic()
            await self._settle(session)
            session.recent.clear()
            chan.write(command.rstrip("\n").encode() + b"\r")
            code = await self._wait_frame(start + timeout, after=command.rstrip("\n")[-12:].encode())
            timed_out = code is None and not session.closed
            if timed_out:
                chan.write(b"\x03")
                await asyncio.sleep(0.2)
            text = self.screen()
        return CommandResult(output=text, exit_code=code, timed_out=timed_out,
                             duration_s=time.monotonic() - start, output_bytes=len(text))

    async def close(self) -> None:
        if self._sftp is not None:
            self._sftp.exit()
            self._sftp = None
        if self._chan is not None:
            self._chan.close()
