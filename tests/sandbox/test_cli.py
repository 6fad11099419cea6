"""`t1 sandbox exec`: output, exit codes, timeouts and bad input, through the real CLI entry point."""

from __future__ import annotations

import shutil

import pytest

from t1.cli.main import main
from t1.cli.sandbox_cmd import command_text

from .conftest import sandbox_tmp_root


@pytest.fixture
def root_override() -> str:
    root = sandbox_tmp_root()
    yield f"sandbox.local.root={root}/trees"
    shutil.rmtree(root, ignore_errors=True)


def test_exec_prints_output_and_exits_with_the_command_status(root_override: str, capsys: pytest.CaptureFixture[str]) -> None:
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
