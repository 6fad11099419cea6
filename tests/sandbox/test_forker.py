"""The forker thread: process starts from a nearly empty file table, no signal handler ever run there,
and children that start with an ordinary signal state."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import subprocess
from pathlib import Path

import pytest

from t1.sandbox.isolation.forker import forker, popen


def _status_mask(status: str, field: str) -> int:
    line = next(line for line in status.splitlines() if line.startswith(field + ":"))
    return int(line.split()[1], 16)


def _bit(sig: int) -> int:
    return 1 << (sig - 1)


def test_forker_thread_blocks_every_signal() -> None:
    """A handler run on that thread would use its file table: libuv's SIGCHLD handler takes its
    lock by reading a pipe by number, and a pipe of a process start sitting at that number there
    blocked the thread, and every later start, for good (the local run's intermittent hang)."""
    tid = forker().native_id
    with open(f"/proc/self/task/{tid}/status") as f:
        blocked = _status_mask(f.read(), "SigBlk")
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGPIPE, signal.SIGALRM):
        assert blocked & _bit(sig), f"{sig!r} reaches the forker thread"


def test_children_start_with_no_blocked_or_ignored_signals() -> None:
    # As in a coordinator that a shell started in the background: SIGINT and SIGQUIT ignored.
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGQUIT)}
    try:
        proc = popen(["cat", "/proc/self/status"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert proc.stdout is not None
    status = proc.stdout.read().decode()
    proc.stdout.close()
    assert proc.wait() == 0
    assert _status_mask(status, "SigBlk") == 0
    standard = (1 << 31) - 1  # signals 1-31; glibc's posix_spawn itself ignores its internal 32 and 33
    assert _status_mask(status, "SigIgn") & standard == 0, "the child inherits ignored signals (SIGPIPE, SIGINT, ...)"


def test_pipes_fds_cwd_session_and_env(tmp_path: Path) -> None:
    read, write = os.pipe()
    target = max(int(fd) for fd in os.listdir("/proc/self/fd")) + 50  # a free number, named in the command
    os.dup2(write, target)
    os.close(write)
    try:
        proc = popen(["bash", "-c", f'echo "$PWD $X $$ $(ps -o sid= -p $$)" >&{target}; cat; echo err >&2; ls '
                                    '/proc/self/fd'],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(target,),
                     env={"PATH": "/usr/bin:/bin", "X": "x1"}, cwd=tmp_path, start_new_session=True)
    finally:
        os.close(target)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(b"through the pipe\n")
    proc.stdin.close()
    out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    proc.stdout.close()
    proc.stderr.close()
    assert proc.wait() == 0
    with os.fdopen(read, "rb") as f:
        cwd, x, pid, sid = f.read().decode().split()
    assert (cwd, x, pid) == (str(tmp_path), "x1", str(proc.pid)) and sid == pid, "own cwd, env, new session"
    lines = out.splitlines()
    assert lines[0] == "through the pipe" and err == "err\n"
    assert sorted(int(fd) for fd in lines[1:]) == [0, 1, 2, 3, target], "only stdio, the passed fd and ls's own"


def test_missing_program_and_kill() -> None:
    with pytest.raises(FileNotFoundError, match="no-such-program"):
        popen(["no-such-program-t1"])
    proc = popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    assert proc.poll() is None
    proc.kill()
    assert proc.wait() == -signal.SIGKILL and proc.poll() == -signal.SIGKILL


def _pipe_transport_round(loop_factory) -> tuple[bool, bool, bool]:
    """Hand a pipe's write end to a loop's pipe transport and close it: (the file object closes its
    descriptor, the transport closed the descriptor, a number reused afterwards survives a late close)."""
    from t1.sandbox.local.local_server import transport_pipe

    async def main() -> tuple[bool, bool, bool]:
        loop = asyncio.get_running_loop()
        read, write = os.pipe()
        handed = transport_pipe(loop, os.fdopen(write, "wb"), "wb")
        fd = handed.fileno()
        transport, _ = await loop.connect_write_pipe(asyncio.Protocol, handed)
        transport.close()
        for _ in range(3):
            await asyncio.sleep(0)
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
            closed = False
        except OSError:
            closed = True
        reused = os.dup(read)
        os.dup2(reused, fd)  # another thread's new pipe lands on the freed number
        handed.close()
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
            survives = True
        except OSError:
            survives = False
        for n in {read, reused, fd}:
            with contextlib.suppress(OSError):
                os.close(n)
        return handed.closefd, closed, survives

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main())


def test_pipe_transports_close_a_sessions_descriptors_once_under_uvloop_and_asyncio():
    uvloop = pytest.importorskip("uvloop")
    # uvloop closes the descriptor in libuv, then calls close() on the file object as well; the
    # object it gets must not close the number again (another thread may hold it by then).
    assert _pipe_transport_round(uvloop.new_event_loop) == (False, True, True)
    # asyncio's transports close only the file object: it must own the descriptor, or it leaks.
    assert _pipe_transport_round(asyncio.new_event_loop) == (True, True, True)
