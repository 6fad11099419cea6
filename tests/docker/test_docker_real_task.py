"""A vendored real task through `t1 tasks oracle|verify --set sandbox.provider=docker`: the oracle resolves, untouched
does not."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest
from private_dockerd import BASE_IMAGE, PrivateDockerd

REAL = Path(__file__).parents[1] / "fixtures" / "real_tasks"


def offline_copy(task: Path, into: Path, extra: str = "allow_internet = false\n") -> Path:
    """The task with `allow_internet = false`: this engine has no network to give, so T1's offline shims stand in."""
    copy = into / task.name
    shutil.copytree(task, copy)
    toml = copy / "task.toml"
    toml.write_text(toml.read_text().replace("[environment]\n", "[environment]\n" + extra, 1))
    return copy


def sets(dockerd: PrivateDockerd) -> list[str]:
    return ["--set", "sandbox.provider=docker", "--set", f"sandbox.docker.socket={dockerd.socket}",
            "--set", f"sandbox.docker.default_image={BASE_IMAGE}", "--json"]


def test_missing_image_and_internet_are_reports(dockerd: PrivateDockerd, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from t1.cli.main import main

    absent = offline_copy(REAL / "harbor" / "simple-task", tmp_path / "a", 'allow_internet = false\n'
                                                                           'docker_image = "t1-absent:3"\n')
    assert main(["tasks", "oracle", str(absent), *sets(dockerd)]) == 1
    run = json.loads(capsys.readouterr().out)
    assert run["status"] == "needs_image" and "t1-absent:3" in run["detail"], run
    internet = REAL / "harbor" / "simple-task"  # allows the internet; no internet network configured
    assert main(["tasks", "oracle", str(internet), *sets(dockerd)]) == 1
    run = json.loads(capsys.readouterr().out)
    assert run["status"] == "needs_network" and "sandbox.docker.internet_network" in run["detail"], run


def test_simple_task_replayed_oracle_resolves_untouched_does_not(dockerd: PrivateDockerd, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from t1.cli.main import main

    task = offline_copy(REAL / "harbor" / "simple-task", tmp_path)
    replayed = [*sets(dockerd), "--set", "sandbox.docker.build=false"]  # the default image, its Dockerfile replayed
    assert main(["tasks", "oracle", str(task), *replayed]) == 0
    oracle = capsys.readouterr().out
    assert '"resolved": true' in oracle and '"status": "ok"' in oracle, oracle
    assert main(["tasks", "verify", str(task), *replayed]) == 0
    untouched = capsys.readouterr().out
    assert '"resolved": false' in untouched and '"status": "ok"' in untouched, untouched
    with contextlib.closing(dockerd.client()) as client:
        assert not client.containers.list(all=True)
