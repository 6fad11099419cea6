"""The docker provider's pure parts, without an engine: who owns a container, which cgroups a session joins."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from t1.sandbox.docker.docker_engine import LABEL_HOST, LABEL_PID, cgroup_procs, owner_alive, owner_labels
from t1.sandbox.docker.docker_provider import container_namespaces


def test_owner_alive_only_for_the_same_live_process() -> None:
    mine = owner_labels()
    assert owner_alive(mine)
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not owner_alive({**mine, LABEL_PID: str(gone.pid)})  # pid exits: its containers are stale
    assert not owner_alive({**mine, "t1.owner.start": "0"})  # the pid was reused by another process
    assert not owner_alive({**mine, LABEL_PID: "not-a-pid"})
    assert owner_alive({**mine, LABEL_HOST: "another-host", LABEL_PID: str(gone.pid)})  # not ours to judge


def test_cgroup_procs_follow_the_container_process(tmp_path: Path) -> None:
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = [line for line in lines if any(c in line.split(":")[1].split(",") for c in ("memory", "pids", "cpu"))]
    if not v1:  # cgroup v2: one unified hierarchy
        (tmp_path / "cgroup.controllers").write_text("memory pids cpu\n")
    own = cgroup_procs(os.getpid(), tmp_path)  # v1: one file per memory, pids and cpu hierarchy
    assert len(own) == max(1, len(v1)) and all(p.startswith(str(tmp_path)) and p.endswith("/cgroup.procs") for p in own)


def test_own_process_shares_every_namespace() -> None:
    assert container_namespaces(os.getpid()) == ()
