"""The embedded SSH server of the local provider: loopback only, key auth, every session in bubblewrap.

The SSH user name is the sandbox id (`verifier_user(id)` for its verifier sessions). Each sandbox has one bubblewrap
init holding its namespaces
(`t1.sandbox.isolation.nsinit.SandboxInit`, started by `start_sandbox`, or on the first session of a tree
registered directly in `trees`); every session (exec, shell, PTY shell, the SFTP subsystem)
enters them, so all sessions of a sandbox see the same files, processes and loopback network.
Closing the channel or losing the connection kills the session's process group; a PTY session ends
when its shell exits (background jobs left on the terminal are killed); `end_sandbox`
kills the init and with it every process of the sandbox. Sessions are spawned from a worker
thread and reaped through pidfds, so starting one never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import struct
import subprocess
import termios
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

import asyncssh

from t1.sandbox.isolation.bwrap import NamespaceTarget, SandboxTree, session_launch
from t1.sandbox.isolation.forker import Child
from t1.sandbox.isolation.nsinit import SandboxInit, hang_up, kill_group, spawn, wait_exit
from t1.sandbox.isolation.pristine import PristineState
from t1.sandbox.types import ShellRole

log = logging.getLogger(__name__)
# Longer than the coordinator's (`sandbox.shell.keepalive_s`): a connection it keeps alive answers before this side
# would probe, so an idle sandbox costs one keepalive exchange, not two.
KEEPALIVE_S = 60

_READ_CHUNK = 65536
PTY_DRAIN_S = 0.5  # how long a PTY is read after its shell exited, before what holds it open is killed


def transport_pipe(loop: asyncio.AbstractEventLoop, source: IO[bytes] | int, mode: str) -> IO[bytes]:
    """A file object for `connect_read_pipe`/`connect_write_pipe`, on a copy of `source`'s
    descriptor that the transport alone closes, once (`source` itself is closed now, or left to
    its owner when it is a bare number).

    uvloop's pipe transports close the descriptor in libuv and then call close() on the file
    object too: a second close of a number that another thread, starting a process and creating
    its pipes, may just have been given. That pipe then failed with EBADF (an SFTP session that
    could not start). So under uvloop the file object does not close its descriptor; under
    asyncio, whose transports close only the file object, it does.
    """
    fd = os.dup(source if isinstance(source, int) else source.fileno())
    if not isinstance(source, int):
        source.close()
    owns = not type(loop).__module__.startswith("uvloop")
    return open(fd, mode, buffering=0, closefd=owns)


VERIFIER_SUFFIX = "+verifier"


def verifier_user(sandbox_id: str) -> str:
    """The SSH user name of a sandbox's verifier sessions."""
    return sandbox_id + VERIFIER_SUFFIX


def parse_user(username: str) -> tuple[str, ShellRole]:
    """Sandbox id and role of an SSH user name (pure)."""
    if username.endswith(VERIFIER_SUFFIX):
        return username[: -len(VERIFIER_SUFFIX)], ShellRole.VERIFIER
    return username, ShellRole.AGENT


def session_members(sid: int) -> list[int]:
    """Pids of the processes whose session id is `sid`, as this process's /proc shows them."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):  # gone meanwhile
            continue
        if len(fields) > 3 and int(fields[3]) == sid:
            found.append(int(entry.name))
    return found


def kill_session(sid: int) -> int:
    """SIGKILL every process left in session `sid` (a PTY shell's, after the shell exited); how many."""
    killed = 0
    for pid in session_members(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


def _set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class _SandboxSession(asyncssh.SSHServerSession[bytes]):
    """Runs one channel's command inside the sandbox and pumps bytes both ways."""

    def __init__(
        self, tree: SandboxTree, track: Callable[[_SandboxSession, bool], None],
        ns_target: Callable[[SandboxTree, ShellRole], Awaitable[NamespaceTarget | None]],
        role: ShellRole = ShellRole.AGENT,
    ) -> None:
        self._tree = tree
        self._role = role
        self._track = track
        self._ns_target = ns_target
        self._chan: asyncssh.SSHServerChannel[bytes] | None = None
        self._command: str | None = None
        self._subsystem: str | None = None
        self._pty: tuple[str, int, int] | None = None
        self._proc: Child | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self._killed = False
        self._hangup: asyncio.Task[None] | None = None
        self._input_ready = False
        self._master: int | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._pending_input: list[bytes] = []
        self._stdin_eof = False
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, chan: asyncssh.SSHServerChannel[bytes]) -> None:  # type: ignore[override]
        self._chan = chan
        self._track(self, True)

    def pty_requested(self, term_type: str | None, term_size: tuple[int, int, int, int], term_modes: Any) -> bool:
        self._pty = (term_type or "xterm", term_size[0] or 80, term_size[1] or 24)
        return True

    def shell_requested(self) -> bool:
        return True

    def exec_requested(self, command: str) -> bool:
        self._command = command
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        self._subsystem = subsystem
        return subsystem == "sftp"

    def session_started(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._serve())

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        if self._master is not None:
            _set_winsize(self._master, width, height)

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if not self._input_ready:  # held until the process and its stdin pipe are set up
            self._pending_input.append(data)
        else:
            self._write_input(data)

    def eof_received(self) -> bool:
        self._stdin_eof = True
        if self._input_ready and self._stdin is not None:
            self._stdin.close()
        return True

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.kill()
        if self._task is None:
            self._track(self, False)

    @property
    def sandbox_id(self) -> str:
        return self._tree.sandbox_id

    async def finished(self) -> None:
        """Wait (bounded) until the session's process is gone and its pumps stopped."""
        for task in (self._task, self._hangup):
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(task), 10)

    def kill(self) -> None:
        """End the session's processes (a spawn still in flight is ended once it exists)."""
        self._killed = True
        if self._proc is None or self._proc.returncode is not None:
            return
        if self._tree.bubblewrap:
            if self._hangup is None:
                self._hangup = asyncio.get_running_loop().create_task(hang_up(self._proc))
        else:
            kill_group(self._proc)

    def _write_input(self, data: bytes) -> None:
        try:
            if self._master is not None:
                os.write(self._master, data)
            elif self._stdin is not None and not self._stdin.is_closing():
                self._stdin.write(data)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            log.debug("sandbox %s: input dropped: %s", self._tree.sandbox_id, exc)

    async def _serve(self) -> None:
        assert self._chan is not None
        chan = self._chan
        try:
            status = await self._spawn_and_pump(chan)
        except Exception as exc:  # the session must end with a status, whatever went wrong
            log.exception("sandbox %s: session failed", self._tree.sandbox_id)
            with contextlib.suppress(OSError, asyncssh.Error):
                chan.write_stderr(f"t1 sandbox session failed: {exc}\n".encode())
            status = 255
        with contextlib.suppress(OSError, asyncssh.Error):
            chan.exit(status)
        self._track(self, False)

    async def _spawn_and_pump(self, chan: asyncssh.SSHServerChannel[bytes]) -> int:
        target = await self._ns_target(self._tree, self._role)
        launch = session_launch(self._tree, self._command, self._subsystem, self._pty, target, self._role)
        loop = asyncio.get_running_loop()
        popen: dict[str, Any] = {"env": launch.env, "cwd": launch.cwd, "start_new_session": launch.new_session}
        if self._pty is not None:
            master, slave = os.openpty()
            _set_winsize(master, self._pty[1], self._pty[2])
            self._master = master
            try:
                self._proc = await spawn(launch.argv, stdin=slave, stdout=slave, stderr=slave, **popen)
            finally:
                os.close(slave)
            reader = asyncio.StreamReader()
            pty_out, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                      transport_pipe(loop, master, "rb"))
            pumps = [self._pump_terminal(reader, chan, pty_out)]
        else:
            proc = self._proc = await spawn(
                launch.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen,
            )
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            self._stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, transport_pipe(loop, proc.stdin, "wb"))
            out, err = asyncio.StreamReader(), asyncio.StreamReader()
            await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(out), transport_pipe(loop, proc.stdout, "rb")
            )
            await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(err), transport_pipe(loop, proc.stderr, "rb")
            )
            pumps = [self._pump(out, chan.write), self._pump(err, chan.write_stderr)]
        if self._killed:  # the channel went away while the process was being spawned
            self.kill()
        self._input_ready = True
        for data in self._pending_input:
            self._write_input(data)
        self._pending_input.clear()
        if self._stdin_eof:
            self.eof_received()
        await asyncio.gather(*pumps)
        code = await wait_exit(self._proc)
        if self._stdin is not None:
            self._stdin.close()
        if self._master is not None:
            os.close(self._master)
            self._master = None
        return code if code >= 0 else 128 - code

    async def _pump_terminal(self, reader: asyncio.StreamReader, chan: asyncssh.SSHServerChannel[bytes],
                             transport: asyncio.BaseTransport) -> None:
        """Pump the PTY until the shell exits. A background job still holding the terminal (`sleep 1000 &`,
        then `exit`) would keep the master open forever: once the shell is gone, what is left of its
        terminal session is killed (and the client told so), so the session ends as the shell did."""
        assert self._proc is not None
        pump = asyncio.ensure_future(self._pump(reader, chan.write))
        exited = asyncio.ensure_future(wait_exit(self._proc))
        try:
            await asyncio.wait({pump, exited}, return_when=asyncio.FIRST_COMPLETED)
            if pump.done():
                return
            with contextlib.suppress(TimeoutError):  # the shell's last output is still in the PTY
                await asyncio.wait_for(asyncio.shield(pump), PTY_DRAIN_S)
            if pump.done():
                return
            killed = kill_session(self._proc.pid)
            log.info("sandbox %s: the shell exited; killed %d process(es) left on its terminal",
                     self._tree.sandbox_id, killed)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pump), PTY_DRAIN_S)
            if killed:
                with contextlib.suppress(OSError, asyncssh.Error):
                    chan.write_stderr(f"\r\nt1: the shell exited; killed {killed} background process(es) "
                                      "still holding its terminal\r\n".encode())
        finally:
            pump.cancel()
            transport.close()
            await asyncio.gather(pump, exited, return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, write: Callable[[bytes], None]) -> None:
        while True:
            try:
                data = await reader.read(_READ_CHUNK)
            except OSError:  # EIO from a PTY master once the last slave closes
                return
            if not data:
                return
            await self._writable.wait()
            try:
                write(data)
            except (OSError, asyncssh.Error, BrokenPipeError):
                self.kill()
                return


class _SandboxServer(asyncssh.SSHServer):
    """Authenticates `sandbox-id@` with the provider's client key and hands out sandbox sessions."""

    def __init__(self, owner: LocalSshServer) -> None:
        self._owner = owner
        self._tree: SandboxTree | None = None
        self._role = ShellRole.AGENT
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._owner._connections.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        sandbox_id, self._role = parse_user(username)
        self._tree = self._owner.trees.get(sandbox_id)
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        ok = self._tree is not None and key.public_data == self._owner.client_key.public_data
        if ok and self._conn is not None:
            self._owner._connections.add(self._conn)
        return ok

    def session_requested(self) -> asyncssh.SSHServerSession[bytes] | bool:
        if self._tree is None:
            return False
        return _SandboxSession(self._tree, self._owner._track_session, self._owner.ns_target, self._role)


class LocalSshServer:
    """The embedded server: one host key, one client key, a registry of sandbox trees."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError(f"the embedded SSH server listens on loopback only, got host {host!r}")
        self.host, self._port = host, port
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.trees: dict[str, SandboxTree] = {}
        self._server: asyncssh.SSHAcceptor | None = None
        self._connections: set[asyncssh.SSHServerConnection] = set()
        self._sessions: set[_SandboxSession] = set()
        self._inits: dict[str, SandboxInit] = {}
        self._init_locks: dict[str, asyncio.Lock] = {}

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.get_port())

    async def start(self) -> None:
        self._server = await asyncssh.create_server(
            lambda: _SandboxServer(self), self.host, self._port,
            server_host_keys=[self.host_key], encoding=None, allow_scp=False, line_editor=False,
            x509_trusted_certs=None, agent_forwarding=False, x11_forwarding=False,
            keepalive_interval=KEEPALIVE_S, keepalive_count_max=4,
        )

    async def start_sandbox(self, tree: SandboxTree) -> None:
        """Register `tree` and start its namespace init (with bubblewrap), so sessions can log in."""
        self.trees[tree.sandbox_id] = tree
        await self.ns_target(tree)

    async def ns_target(self, tree: SandboxTree, role: ShellRole = ShellRole.AGENT) -> NamespaceTarget | None:
        """The namespaces of `tree`'s init, started on first use; None without bubblewrap.

        For a verifier session of an overlay sandbox, its pristine system is attached first
        (`t1.sandbox.isolation.pristine`).
        """
        if not tree.bubblewrap:
            return None
        init = await self._init(tree)
        if role is ShellRole.VERIFIER and tree.overlay and init.pristine is PristineState.NONE:
            async with self._init_locks.setdefault(tree.sandbox_id, asyncio.Lock()):
                await asyncio.to_thread(init.ensure_pristine)
        return init.target

    async def end_setup(self, sandbox_id: str) -> None:
        """The task's setup in sandbox `sandbox_id` is done: fix the system its verifier runs
        (`SandboxInit.end_setup`)."""
        tree = self.trees.get(sandbox_id)
        if tree is None:
            raise RuntimeError(f"sandbox {sandbox_id} is not registered (destroyed?)")
        if not tree.bubblewrap:
            return
        init = await self._init(tree)
        async with self._init_locks.setdefault(tree.sandbox_id, asyncio.Lock()):
            await asyncio.to_thread(init.end_setup)

    async def _init(self, tree: SandboxTree) -> SandboxInit:
        lock = self._init_locks.setdefault(tree.sandbox_id, asyncio.Lock())
        async with lock:
            init = self._inits.get(tree.sandbox_id)
            if init is None:
                if self.trees.get(tree.sandbox_id) is not tree:
                    raise RuntimeError(f"sandbox {tree.sandbox_id} is not registered (destroyed?)")
                init = await SandboxInit.start(tree)
                if self.trees.get(tree.sandbox_id) is not tree:  # destroyed while its init was starting
                    await init.stop(log.warning)
                    raise RuntimeError(f"sandbox {tree.sandbox_id} was destroyed while starting")
                self._inits[tree.sandbox_id] = init
            return init

    def host_path(self, sandbox_id: str, name: str) -> Path:
        """Where T1 reaches tree dir `name` of a live sandbox (through its namespace with an overlay root)."""
        init = self._inits.get(sandbox_id)
        return init.host_path(name) if init is not None else self.trees[sandbox_id].host_path(name)

    async def _stop_init(self, sandbox_id: str) -> None:
        self._init_locks.pop(sandbox_id, None)
        init = self._inits.pop(sandbox_id, None)
        if init is not None:
            await init.stop(log.warning)

    def _track_session(self, session: _SandboxSession, alive: bool) -> None:
        (self._sessions.add if alive else self._sessions.discard)(session)

    def drop_connections(self, sandbox_id: str) -> int:
        """Abort every connection logged in as `sandbox_id` (fault injection and destroy)."""
        victims = [c for c in self._connections if parse_user(c.get_extra_info("username") or "")[0] == sandbox_id]
        for conn in victims:
            conn.abort()
        return len(victims)

    async def end_sandbox(self, sandbox_id: str) -> None:
        """Drop the sandbox's connections and wait until all its session processes are gone."""
        self.drop_connections(sandbox_id)
        sessions = [s for s in self._sessions if s.sandbox_id == sandbox_id]
        for session in sessions:
            session.kill()
        await self._stop_init(sandbox_id)
        await asyncio.gather(*(s.finished() for s in sessions))

    async def close(self) -> None:
        sessions = list(self._sessions)
        for conn in list(self._connections):
            conn.abort()
        for session in sessions:
            session.kill()
        await asyncio.gather(*(self._stop_init(sandbox_id) for sandbox_id in list(self._inits)))
        await asyncio.gather(*(s.finished() for s in sessions))
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
