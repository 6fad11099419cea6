"""A hostile task folder cannot make T1 read files outside it: every escaping path is refused by name."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from t1.cli.main import main
from t1.tasks.formats.dataset import load_task
from t1.tasks.spec import TaskParseError

ESCAPES = [
    ("harbor-csv-report", "instruction.md"),
    ("harbor-csv-report", "solution/solve.sh"),
    ("harbor-csv-report", "tests/test_outputs.py"),
    ("harbor-csv-report", "environment/sales.csv"),
    ("tb1-word-count", "solution.sh"),
    ("tb1-run-tests", "run-tests.sh"),
    ("tb1-word-count", "tests/test_outputs.py"),
]


@pytest.mark.parametrize(("task", "member"), ESCAPES)
def test_symlinks_out_of_the_task_are_refused(fixtures: Path, tmp_path: Path, task: str, member: str) -> None:
    root = Path(shutil.copytree(fixtures / task, tmp_path / task))
    target = root / member
    assert target.is_file()
    target.unlink()
    target.symlink_to("/etc/shadow")
    with pytest.raises(TaskParseError) as err:
        load_task(root)
    assert err.value.file == str(target) and "outside the task folder" in err.value.problem


def test_escapes_through_folders_fifos_and_dangling_links(fixtures: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(fixtures / "harbor-csv-report", tmp_path / "t"))
    (root / "tests" / "keys").symlink_to("/root")  # a folder link: everything under it would leak
    with pytest.raises(TaskParseError, match="tests/keys: is a symlink to /root"):
        load_task(root)
    (root / "tests" / "keys").unlink()
    (root / "tests" / "inner").symlink_to(root / "environment")  # links that stay inside are fine
    assert load_task(root).id == "t"
    os.mkfifo(root / "environment" / "pipe")
    with pytest.raises(TaskParseError, match="environment/pipe: is neither a file nor a folder"):
        load_task(root)


def test_validate_reports_the_escaping_file(fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(shutil.copytree(fixtures / "harbor-csv-report", tmp_path / "t"))
    (root / "instruction.md").unlink()
    (root / "instruction.md").symlink_to("/etc/shadow")
    assert main(["tasks", "validate", str(root), str(fixtures / "tb1-word-count")]) == 2
    out = capsys.readouterr().out
    assert f"invalid: {root / 'instruction.md'}: instruction.md: is a symlink to /etc/shadow" in out
    assert "ok: " in out and "root:" not in out  # nothing of the target was read
