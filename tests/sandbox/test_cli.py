"""`t1 sandbox exec` and `shell`: output, exit codes, timeouts and bad input, through the real CLI entry point."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from t1.cli.main import main
from t1.cli.sandbox_cmd import command_text

from .conftest import sandbox_tmp_root


@pytest.fixture
def root_override() -> str:
    root = sandbox_tmp_root()
    yield f"sandbox.local.root={root}/trees"
    shutil.rmtree(root, ignore_errors=True)


def test_exec_prints_output_and_exits_with_the_command_status(
    root_override: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["sandbox", "exec", "--set", root_override, "--", "cd /app && pwd && echo err >&2; exit 7"])
    out = capsys.readouterr().out
    assert code == 7 and out == "/app\nerr\n"


def test_exec_timeout_and_terminal_mode(root_override: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sandbox", "exec", "--set", root_override, "--timeout", "1", "--", "sleep", "30"]) == 124
    assert "timed out" in capsys.readouterr().err
    assert main(["sandbox", "exec", "--set", root_override, "--terminal", "--", "echo $((2+3))"]) == 0
    assert "\n5\n" in capsys.readouterr().out


def test_command_words_are_quoted_and_missing_commands_named() -> None:
    assert command_text(["--", "echo", "a b"]) == "echo 'a b'"
    assert command_text(["--", "echo $HOME"]) == "echo $HOME"
    with pytest.raises(SystemExit, match="needs a command"):
        command_text(["--"])


def test_bad_config_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sandbox", "exec", "--set", "sandbox.provider=ssh", "--", "true"])
    assert exc.value.code == 2 and "ssh.hosts" in capsys.readouterr().err


def _alive(marker: str) -> list[int]:
    """Pids whose command line contains `marker`."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" "):
                    found.append(int(entry.name))
    return found


def test_shell_returns_after_exit_while_a_background_job_holds_the_terminal(root_override: str) -> None:
    """Issue 19 case 8: `sleep &` then `exit` in `t1 sandbox shell` on a real terminal: the command returns
    promptly, says it killed the job, and the job is gone."""
    marker = f"sleep {os.getpid() % 1000}.{time.monotonic_ns() % 997}"  # a command line no one else runs
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "t1.cli.main", "sandbox", "shell", "--set", root_override],
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    seen = b""

    def read_until(token: bytes, timeout_s: float) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout_s
        while token not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                with contextlib.suppress(OSError):
                    seen += os.read(master, 65536)
        assert token in seen, f"no {token!r} within {timeout_s}s; got {seen[-2000:]!r}"

    try:
        read_until(b"exit the shell to destroy it", 60)
        read_until(b"# ", 30)  # the prompt: typed ahead of it, bash's start-up may discard the input
        os.write(master, f"{marker} &\necho started-$((6*7))\n".encode())
        read_until(b"started-42", 30)
        deadline = time.monotonic() + 10  # the echo can come before the job's fork has exec'd sleep
        while not _alive(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(marker), "the background job runs"
        os.write(master, b"exit\n")
        t0 = time.monotonic()
        code = proc.wait(timeout=30)
        took = time.monotonic() - t0
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                seen += chunk
        assert code == 0 and took < 15, (code, took)
        assert not _alive(marker), "the background job died with the session"
        assert b"killed 1 background process(es)" in seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
