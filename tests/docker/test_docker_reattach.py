"""Docker sandboxes outlive their coordinator: a new provider of the same run reattaches a container by its record.

The first provider stands for a coordinator killed with -9: its SSH server goes away (every
session with it) and it never destroys anything; the second is built as the restarted
coordinator builds it, with the same run dir, and gets only the record, through JSON.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

import pytest
from private_dockerd import PrivateDockerd, docker_config

from t1.config.sandbox import ShellConfig
from t1.sandbox.docker.docker_engine import LABEL_PID, LABEL_SANDBOX, LABEL_START, owner_alive
from t1.sandbox.docker.docker_provider import DockerProvider
from t1.sandbox.run_lease import RunLease
from t1.sandbox.types import SandboxGone, SandboxRecord, SandboxRequest, ShellRole
from t1.sandbox.verifier.verifier_role import VERIFIER_UID

SHELL = ShellConfig(command_timeout_s=30)
SPAWN = "setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $!"


def provider(dockerd: PrivateDockerd, run_dir: Path | None) -> DockerProvider:
    return DockerProvider(docker_config(dockerd, memory_mb=256, pids=64), SHELL, run_dir)


async def test_reattach_finds_files_and_processes_and_refuses_what_is_not_its_own(
        dockerd: PrivateDockerd, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = provider(dockerd, run_dir)
    assert first.survives_coordinator
    sandbox = await first.create(SandboxRequest(env=(("TASK_VAR", "v1"),)))
    await sandbox.end_setup()
    shell = await sandbox.open_shell()
    pid = (await shell.run(SPAWN)).output.strip()
    await shell.run("echo before the crash > /app/kept.txt")
    spare = await first.create(SandboxRequest())  # one the restarted coordinator does not reattach
    record = SandboxRecord.from_json(json.loads(json.dumps(sandbox.record().to_json())))
    assert record.provider == "docker" and record.sandbox_id == sandbox.id
    await first.server.close()  # the coordinator's death: every session and connection gone, nothing destroyed
    first.engine.close()  # type: ignore[union-attr]

    second = provider(dockerd, run_dir)
    others = provider(dockerd, tmp_path / "another-run")
    try:
        with pytest.raises(SandboxGone, match="belongs to another run"):
            await others.reattach(record)
        with pytest.raises(SandboxGone, match="is sandbox 'sb-"):
            await second.reattach(SandboxRecord("docker", "sb-000000000000", record.data))
        again = await second.reattach(record)
        shell = await again.open_shell()
        found = await shell.run(f"cat /app/kept.txt; kill -0 {pid} && echo alive; echo $TASK_VAR")
        assert found.output.split("\n")[:3] == ["before the crash", "alive", "v1"], found.output
        if second.separates_verifier:  # the verifier's own user and the system fixed at end_setup, as before
            await shell.run("echo agent > /usr/bin/t1-after-setup")  # after end_setup: never the verifier's system
            verifier = await again.open_shell(role=ShellRole.VERIFIER)
            who = await verifier.run("id -u; cat /app/kept.txt; test -e /usr/bin/t1-after-setup || echo pristine")
            assert who.output.split("\n")[:3] == [str(VERIFIER_UID), "before the crash", "pristine"], who.output
        with pytest.raises(SandboxGone, match="already attached"):
            await second.reattach(record)
        assert await others.sweep_unclaimed() == 0  # not its run's
        assert await second.sweep_unclaimed() == 1  # the spare: nobody reattached it
        with pytest.raises(SandboxGone, match="no longer exists"):
            await provider(dockerd, run_dir).reattach(spare.record())
        assert (await shell.run("echo still")).output.strip() == "still"
        await second.destroy(again)
        with pytest.raises(SandboxGone, match="no longer exists"):
            await provider(dockerd, run_dir).reattach(record)
    finally:
        await second.close()
        await others.close()


def test_a_dead_owners_container_is_kept_while_its_run_is_live(tmp_path: Path) -> None:
    lease = RunLease.of(tmp_path / "run")
    dead = {LABEL_SANDBOX: "sb-1", "t1.owner.host": os.uname().nodename, LABEL_PID: "999999999",
            LABEL_START: "1", **lease.labels()}
    assert not owner_alive(dead)  # owner gone, nobody holds the run: swept
    fd = os.open(lease.lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the restarted coordinator holds the run dir (DirLock)
        assert owner_alive(dead)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lease.lock)
        assert not owner_alive(dead)  # the run dir was removed: another run, even if a lock is held
    finally:
        os.close(fd)
