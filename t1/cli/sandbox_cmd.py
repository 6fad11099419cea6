"""`t1 sandbox exec -- COMMAND...` and `t1 sandbox shell`: run in, or log into, a fresh sandbox.

`exec` prints the command's (capped) output and exits with its exit code (124 on timeout, 255
when the sandbox was lost). `shell` bridges the local terminal to a PTY shell in the sandbox
(raw mode; the session ends when the remote shell exits, even while a background job still holds the
terminal: the sandbox's server kills such jobs and says so); without a local TTY it reads commands
line by line and runs each in the framed shell.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import sys
import termios
import tty
from typing import Any

from t1.cli.common import add_config_args, config_or_exit

EXIT_TIMEOUT = 124
EXIT_LOST = 255


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("sandbox", help="Run commands in fresh sandboxes (debugging).")
    cmds = parser.add_subparsers(dest="sandbox_command", metavar="ACTION", required=True)
    run = cmds.add_parser("exec", help="Run one command in a fresh sandbox; exit with its exit code.")
    add_config_args(run)
    run.add_argument("--terminal", action="store_true", help="Run on a PTY and print the rendered screen.")
    run.add_argument("--timeout", type=float, default=None, metavar="S", help="Command timeout (default: "
                                                                              "sandbox.shell.command_timeout_s).")
    run.add_argument("--allow-network", action="store_true", help="Give the sandbox network access.")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND...", help="One shell string, or words that "
                                                                                     "are quoted and joined.")
    run.set_defaults(func=_exec)
    shell = cmds.add_parser("shell", help="Open an interactive shell in a fresh sandbox.")
    add_config_args(shell)
    shell.add_argument("--allow-network", action="store_true", help="Give the sandbox network access.")
    shell.set_defaults(func=_shell)


def command_text(argv: list[str]) -> str:
    """`-- 'cd /app && ls'` is a shell string; `-- ls -la 'a b'` is quoted word by word."""
    words = argv[1:] if argv and argv[0] == "--" else argv
    if not words:
        raise SystemExit("error: t1 sandbox exec needs a command after --")
    return words[0] if len(words) == 1 else shlex.join(words)


def _exec(args: argparse.Namespace) -> int:
    command = command_text(args.argv)
    cfg = config_or_exit(args)
    return asyncio.run(_exec_async(cfg, command, args.terminal, args.timeout, args.allow_network))


async def _exec_async(cfg: Any, command: str, terminal: bool, timeout: float | None, allow_network: bool) -> int:
    from t1.sandbox import SandboxLost, SandboxPool, SandboxRequest, build_provider
    pool = SandboxPool(build_provider(cfg.sandbox), cfg.sandbox.pool)
    try:
        async with pool.acquire(SandboxRequest(allow_network=allow_network)) as sandbox:
            shell = await sandbox.open_shell(terminal=terminal)
            result = await shell.run(command, timeout_s=timeout)
    except SandboxLost as exc:
        print(f"error: sandbox lost: {exc}", file=sys.stderr)
        return EXIT_LOST
    finally:
        await pool.close()
    sys.stdout.write(result.output if result.output.endswith("\n") or not result.output else result.output + "\n")
    if result.timed_out:
        print(f"t1: command timed out after {result.duration_s:.1f}s", file=sys.stderr)
        return EXIT_TIMEOUT
    if result.shell_restarted:
        print("t1: the shell exited and was restarted", file=sys.stderr)
    return result.exit_code if result.exit_code is not None else EXIT_LOST


def _shell(args: argparse.Namespace) -> int:
    cfg = config_or_exit(args)
    return asyncio.run(_shell_async(cfg, args.allow_network))


async def _shell_async(cfg: Any, allow_network: bool) -> int:
    from t1.sandbox import SandboxPool, SandboxRequest, SshSandbox, build_provider
    pool = SandboxPool(build_provider(cfg.sandbox), cfg.sandbox.pool)
    try:
        async with pool.acquire(SandboxRequest(allow_network=allow_network)) as sandbox:
            print(f"t1: sandbox {sandbox.id}; exit the shell to destroy it", file=sys.stderr)
            if sys.stdin.isatty() and isinstance(sandbox, SshSandbox):
                return await _bridge_tty(sandbox)
            shell = await sandbox.open_shell()
            loop = asyncio.get_running_loop()
            while line := await loop.run_in_executor(None, sys.stdin.readline):
                result = await shell.run(line.rstrip("\n"))
                sys.stdout.write(result.output)
                sys.stdout.flush()
            return 0
    finally:
        await pool.close()


async def _bridge_tty(sandbox: Any) -> int:
    """Local terminal in raw mode <-> a remote PTY shell, until the remote side exits."""
    cols, rows = os.get_terminal_size()
    process = await sandbox.conn.create_process(
        term_type=os.environ.get("TERM", "xterm"), term_size=(cols, rows), encoding=None
    )
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    loop = asyncio.get_running_loop()
    loop.add_reader(fd, lambda: process.stdin.write(os.read(fd, 4096)))
    try:
        tty.setraw(fd)
        await asyncio.gather(_copy(process.stdout, sys.stdout.buffer), _copy(process.stderr, sys.stderr.buffer))
        await process.wait()
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
    with contextlib.suppress(Exception):
        process.close()
    return int(process.exit_status or 0)


async def _copy(source: Any, sink: Any) -> None:
    while data := await source.read(65536):
        sink.write(data)
        sink.flush()
