"""`t1 tasks ...` end to end through the real CLI entry point."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from t1.cli.main import main


def test_validate(fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "validate", str(fixtures)]) == 0
    assert capsys.readouterr().out.count("ok: ") == 5
    bad = Path(shutil.copytree(fixtures / "harbor-csv-report", tmp_path / "bad"))
    (bad / "task.toml").write_text("[agent]\ntimeout_sec = -5\n")
    assert main(["tasks", "validate", str(bad), str(fixtures / "tb1-word-count")]) == 2
    out = capsys.readouterr().out
    assert f"invalid: {bad / 'task.toml'}: agent.timeout_sec: must be > 0" in out and "ok: " in out
    no_solution = Path(shutil.copytree(fixtures / "tb1-word-count", tmp_path / "nosol"))
    (no_solution / "solution.sh").unlink()
    assert main(["tasks", "validate", str(no_solution)]) == 1
    assert "no reference solution" in capsys.readouterr().out


def test_validate_predicts_and_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real = Path(__file__).parents[1] / "fixtures" / "real_tasks"
    assert main(["tasks", "validate", "--json", str(real / "harbor" / "simple-task")]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "ok"
    assert main(["tasks", "validate", "--json", str(real / "harbor" / "mcp-tools")]) == 1
    line = json.loads(capsys.readouterr().out)
    assert line["status"] == "will_not_run" and line["exit_code"] == 1
    assert {n["kind"] for n in line["needs"]} == {"needs_feature", "needs_image"}
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "task.toml").write_text("[agent]\ntimeout_sec = 'soon'\n")
    assert main(["tasks", "validate", "--json", str(bad), str(real / "harbor" / "simple-task")]) == 2
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines[0]["status"] == "malformed" and "tests: file is missing" in lines[0]["error"]
    assert lines[1]["status"] == "ok"


def test_synth_and_decontam(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "synth", "--out", str(tmp_path / "c"), "--n", "12", "--seed", "4", "--split", "eval"]) == 0
    assert capsys.readouterr().out.startswith("wrote 12 tasks")
    tasks = sorted((tmp_path / "c").iterdir())
    assert len(tasks) == 12 and all("-eval-" in p.name for p in tasks)
    shutil.copytree(tasks[5], tmp_path / "bench" / "copy")
    args = ["tasks", "decontam", "--train", str(tmp_path / "c"), "--against", str(tmp_path / "bench")]
    assert main([*args, "--exclusions", str(tmp_path / "ex.txt")]) == 0
    out = capsys.readouterr()
    assert out.out.startswith(f"{tasks[5].name}\t") and "1 of 12 train tasks" in out.err
    assert (tmp_path / "ex.txt").read_text() == f"{tasks[5].name}\n"
    assert main([*args, "--write-clean", str(tmp_path / "clean")]) == 0
    assert sorted(p.name for p in (tmp_path / "clean").iterdir()) == [p.name for p in tasks if p != tasks[5]]


def test_oracle_and_verify_json(fixtures: Path, sandbox_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = [str(fixtures / "tb1-word-count"), "--json", "--set", f"sandbox.local.root={sandbox_root}"]
    assert main(["tasks", "oracle", *common]) == 0
    line = json.loads(capsys.readouterr().out.strip())
    assert {k: line[k] for k in ("task", "resolved", "reward", "passed", "total", "status")} == {
        "task": "tb1-word-count", "resolved": True, "reward": 4.0, "passed": 4, "total": 4, "status": "ok"}
    assert main(["tasks", "verify", *common, "--reward-mode", "fraction"]) == 0
    line = json.loads(capsys.readouterr().out.strip())
    assert line["resolved"] is False and line["status"] == "ok" and line["reward"] == 0.25


def test_bad_task_folder_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        main(["tasks", "oracle", str(tmp_path)])
    assert err.value.code == 2 and "neither a task folder" in capsys.readouterr().err
