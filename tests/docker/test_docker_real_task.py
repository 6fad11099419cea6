"""A vendored real task through `t1 tasks oracle|verify --set sandbox.provider=docker`: the oracle resolves, untouched does not."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest
from private_dockerd import BASE_IMAGE, PrivateDockerd

REAL = Path(__file__).parents[1] / "fixtures" / "real_tasks"


def offline_copy(task: Path, into: Path) -> Path:
    """The task with `allow_internet = false`: this engine has no network to give, so T1's offline shims stand in."""
    copy = into / task.name
    shutil.copytree(task, copy)
    toml = copy / "task.toml"
    toml.write_text(toml.read_text().replace("[environment]\n", "[environment]\nallow_internet = false\n", 1))
    return copy


def test_simple_task_oracle_resolves_untouched_does_not(dockerd: PrivateDockerd, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from t1.cli.main import main

    task = offline_copy(REAL / "harbor" / "simple-task", tmp_path)
    sets = ["--set", "sandbox.provider=docker", "--set", f"sandbox.docker.socket={dockerd.socket}",
            "--set", f"sandbox.docker.default_image={BASE_IMAGE}", "--json"]
    assert main(["tasks", "oracle", str(task), *sets]) == 0
    oracle = capsys.readouterr().out
    assert '"resolved": true' in oracle and '"status": "ok"' in oracle, oracle
    assert main(["tasks", "verify", str(task), *sets]) == 0
    untouched = capsys.readouterr().out
    assert '"resolved": false' in untouched and '"status": "ok"' in untouched, untouched
    with contextlib.closing(dockerd.client()) as client:
        assert not client.containers.list(all=True)
