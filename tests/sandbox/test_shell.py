"""The framed shell against a real OpenSSH sshd and the embedded server: state, limits, faults."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import tracemalloc
from pathlib import Path

import pytest

from t1.sandbox.ssh.ssh_sandbox import CIPHERS, SshEndpoint, SshSandbox
from t1.sandbox.ssh.ssh_shell import SshShell
from t1.sandbox.ssh.terminal import TerminalShell
from t1.sandbox.types import SandboxLost, Terminal

from .conftest import SHELL_CFG, Server


async def _shell(server: Server) -> SshShell:
    shell = await server.sandbox.open_shell()
    assert isinstance(shell, SshShell)
    result = await shell.run(f"cd {server.scratch}")
    assert result.exit_code == 0, result
    return shell


async def test_state_persists_across_commands(server: Server) -> None:
    shell = await _shell(server)
    await shell.run("mkdir -p sub && cd sub && export T1_X=42 && greet() { echo hi-$1; }")
    result = await shell.run("pwd; echo $T1_X; greet you; false")
    assert result.output.splitlines() == [f"{server.scratch}/sub", "42", "hi-you"]
    assert result.exit_code == 1 and not result.timed_out and not result.shell_restarted
    sleeper = await shell.run("sleep 30 & echo started")
    assert sleeper.output == "started\n"
    jobs = await shell.run("jobs -p | wc -l")
    assert jobs.output.strip() == "1"


async def test_timeout_interrupts_and_keeps_the_shell(server: Server) -> None:
    shell = await _shell(server)
    result = await shell.run("sleep 1000", timeout_s=2)
    assert result.timed_out and result.exit_code == 130 and not result.shell_restarted
    assert result.duration_s < 8
    after = await shell.run("pwd")
    assert after.output.strip() == server.scratch and after.exit_code == 0


async def test_timeout_escalates_to_a_restart_in_the_same_cwd(server: Server) -> None:
    shell = await _shell(server)
    # The loop runs in the worker itself and ignores SIGINT: only a restart ends it.
    result = await shell.run("trap '' INT; while true; do sleep 0.2; done", timeout_s=1)
    assert result.timed_out and result.shell_restarted and result.exit_code is None
    after = await shell.run("pwd; echo alive")
    assert after.output.splitlines() == [server.scratch, "alive"]


async def test_huge_output_is_capped_in_bounded_memory(server: Server) -> None:
    shell = await _shell(server)
    tracemalloc.start()
    try:
        result = await shell.run("head -c 50000000 /dev/zero | tr '\\0' a; echo; echo END", timeout_s=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.exit_code == 0 and result.truncated
    assert result.output_bytes == 50_000_005
    assert result.output.startswith("aaaa") and result.output.endswith("a\nEND\n")
    assert "bytes of output truncated" in result.output and len(result.output) < 4096 + 200
    assert peak < 16 * 1024 * 1024, f"client peak allocation {peak} bytes"
    assert (await shell.run("echo ok")).output == "ok\n"


@pytest.mark.parametrize("command, status", [("exit 3", 3), ("kill -9 $$", 137), ("exec false", 1)])
async def test_shell_death_restarts_and_says_so(server: Server, command: str, status: int) -> None:
    shell = await _shell(server)
    result = await shell.run(command, timeout_s=10)
    assert result.shell_restarted and result.exit_code == status and not result.timed_out
    after = await shell.run("pwd")
    assert after.output.strip() == server.scratch and not after.shell_restarted


async def test_shell_killed_between_commands_is_restarted_before_the_next(server: Server) -> None:
    shell = await _shell(server)
    assert (await shell.run("(sleep 0.3; kill -9 $$) >/dev/null 2>&1 &")).exit_code == 0
    await asyncio.sleep(1.0)
    result = await shell.run("echo $((1+1)); pwd")
    assert result.shell_restarted and result.output.splitlines() == ["2", server.scratch]


async def test_a_cancelled_run_does_not_leak_into_the_next(server: Server) -> None:
    shell = await _shell(server)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(shell.run("sleep 1; echo stale-output"), 0.2)
    result = await shell.run("echo fresh")
    assert result.output == "fresh\n" and result.shell_restarted


async def test_binary_and_long_lines(server: Server) -> None:
    shell = await _shell(server)
    binary = await shell.run("head -c 3000 /dev/urandom; printf '\\xff\\xfeok'")
    assert binary.exit_code == 0 and binary.output.endswith("\ufffd\ufffdok") and binary.output_bytes == 3004
    line = await shell.run("head -c 1000000 /dev/zero | tr '\\0' x")
    assert line.exit_code == 0 and line.truncated and line.output_bytes == 1_000_000
    assert line.output.startswith("xxx") and line.output.endswith("xxx")


async def test_stdin_readers_and_unbalanced_quotes(server: Server) -> None:
    shell = await _shell(server)
    cat = await shell.run("cat; read -r x; echo \"got:[$x] $?\"", timeout_s=5)
    assert not cat.timed_out and cat.output == "got:[] 1\n"
    for bad in ['echo "abc', "echo 'abc", "echo $((1+"]:
        result = await shell.run(bad, timeout_s=5)
        assert result.exit_code == 2 and not result.timed_out and not result.shell_restarted, result
        assert (await shell.run("echo fine")).output == "fine\n"
    assert (await shell.run("echo '{'; echo }")).output == "{\n}\n"


async def test_output_that_imitates_frames_is_just_output(server: Server) -> None:
    shell = await _shell(server)
    fake = "\\n" + "ab" * 24 + "0 /nowhere\\n"
    result = await shell.run(f"printf '{fake}'; set -x; echo traced; set +x; echo $((6*7))")
    assert result.exit_code == 0 and "/nowhere" in result.output and "traced" in result.output
    assert result.output.rstrip().endswith("42")
    ps = await shell.run("ps -eo args | grep -c . ; env | grep -c .")
    assert ps.exit_code == 0 and (await shell.run("echo still")).output == "still\n"


async def test_background_writers_do_not_break_framing(server: Server) -> None:
    shell = await _shell(server)
    start = await shell.run("(for i in 1 2 3 4 5; do echo bg$i; sleep 0.2; done) & echo fg")
    assert start.exit_code == 0 and "fg" in start.output
    seen = start.output
    for _ in range(50):  # poll while the writer runs (slow machines stretch its 1 s)
        await asyncio.sleep(0.2)
        result = await shell.run("echo tick")
        assert result.exit_code == 0 and "tick" in result.output
        seen += result.output
        if "bg5" in seen:
            break
    assert all(f"bg{i}" in seen for i in range(1, 6))


async def test_observations_are_cleaned(server: Server) -> None:
    shell = await _shell(server)
    result = await shell.run("printf '\\033[31mred\\033[0m\\n'; printf '10%%\\r50%%\\r100%%\\n'; printf "
                             "'\\033]0;title\\007done\\n'")
    assert result.output == "red\n100%\ndone\n"


async def test_files_and_directories_over_sftp(server: Server, tmp_path: Path) -> None:
    shell = await _shell(server)
    await shell.write_file(f"{server.scratch}/run.sh", b"#!/bin/sh\necho from-file\n", mode=0o755)
    assert (await shell.run("./run.sh")).output == "from-file\n"
    assert await shell.read_file(f"{server.scratch}/run.sh") == b"#!/bin/sh\necho from-file\n"
    src = tmp_path / "up"
    (src / "nested").mkdir(parents=True)
    (src / "nested" / "a.txt").write_text("A")
    await server.sandbox.upload(str(src), f"{server.scratch}/up")
    assert (await shell.run("cat up/nested/a.txt")).output == "A"
    await shell.run("echo B > up/nested/b.txt")
    dest = tmp_path / "down"
    await server.sandbox.download(f"{server.scratch}/up", str(dest))
    assert sorted(os.listdir(dest / "nested")) == ["a.txt", "b.txt"]


async def test_connection_killed_mid_command_raises_sandbox_lost(server: Server) -> None:
    shell = await _shell(server)
    running = asyncio.ensure_future(shell.run("sleep 30", timeout_s=60))
    await asyncio.sleep(0.5)
    assert server.kill_session() >= 1
    with pytest.raises(SandboxLost):
        await asyncio.wait_for(running, 15)
    assert not server.sandbox.alive
    with pytest.raises(SandboxLost):
        await shell.run("echo again")


async def test_bad_arguments_are_named(server: Server) -> None:
    shell = await _shell(server)
    with pytest.raises(ValueError, match="timeout_s"):
        await shell.run("true", timeout_s=0)
    with pytest.raises(ValueError, match="NUL"):
        await shell.run("echo \x00")


async def test_aead_cipher_first_and_fallbacks_still_work(server: Server) -> None:
    conn = server.sandbox.conn
    assert conn.get_extra_info("send_cipher") == conn.get_extra_info("recv_cipher") == CIPHERS[0]
    assert conn.get_extra_info("send_compression") == "none"
    chacha = dataclasses.replace(server.sandbox.endpoint, ciphers=("chacha20-poly1305@openssh.com",))
    box = await SshSandbox.connect(f"{server.sandbox.id}-chacha", chacha, SHELL_CFG)
    try:
        assert box.conn.get_extra_info("send_cipher") == "chacha20-poly1305@openssh.com"
        shell = await box.open_shell()
        assert (await shell.run("echo $((6*7))")).output == "42\n"
    finally:
        await box.close()


def test_endpoints_refuse_the_none_cipher() -> None:
    for ciphers in [("none",), ("aes256-gcm@openssh.com", "none"), ()]:
        with pytest.raises(ValueError, match="ciphers"):
            SshEndpoint("127.0.0.1", 22, "root", ciphers=ciphers)


async def _screen_until(term: TerminalShell, text: str, count: int = 1, timeout_s: float = 10.0) -> str:
    """Poll the rendered screen until `text` shows `count` times (terminal apps answer asynchronously)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (screen := term.screen()).count(text) < count and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    return screen


async def test_terminal_mode_keys_and_screen(server: Server) -> None:
    term = await server.sandbox.open_shell(terminal=True)
    assert isinstance(term, TerminalShell) and isinstance(term, Terminal)
    result = await term.run(f"cd {server.scratch} && echo $((40+2))", timeout_s=10)
    assert result.exit_code == 0 and "42" in result.output
    await term.send_keys(["echo abc", "Left", "Left", "X", "Enter"])
    assert "aXbc\naXbc" in await _screen_until(term, "aXbc", 2)
    await asyncio.sleep(0.3)  # let readline take the terminal back before typing on
    await term.keystrokes("echo zzz-not-run", 0.3)
    await term.keystrokes("C-c", 0.5)
    await term.send_keys(["echo after-c-c", "Enter"])
    screen = await _screen_until(term, "after-c-c", 2)
    assert "\nzzz-not-run" not in screen and "\nafter-c-c" in screen
    await term.keystrokes(["cat", "Enter"], 0.3)  # typed-ahead CR would reach cat untranslated
    await term.send_keys(["line1", "Enter"])
    assert (await _screen_until(term, "line1", 2)).count("line1") == 2
    await term.send_keys("C-d")
    slow = await term.run("sleep 100", timeout_s=1)
    assert slow.timed_out and "^C" in slow.output
    assert (await term.run("echo ready")).exit_code == 0
    await term.close()
