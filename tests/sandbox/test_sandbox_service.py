"""The local sandbox service (issue 41): sandboxes outlive a kill -9 of the coordinator and are reattached by the
next one of the same run dir; a kill -9 of the service ends them; a service no coordinator attaches to sweeps
everything after its grace period. Real bubblewrap, real processes, real kill -9
(the coordinator stand-in: tests/sandbox/service_owner.py)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.isolation.holders import tree_processes
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.local.service_client import SOCKET_NAME, spawn_service, stop_spawned
from t1.sandbox.ssh.ssh_sandbox import SshSandbox, lost_cause
from t1.sandbox.types import (
    SandboxGone,
    SandboxHostLost,
    SandboxLost,
    SandboxRecord,
    SandboxRequest,
    ShellRole,
)
from t1.tasks.verify.outcome import attempt_failure
from t1.tasks.verify.report import FailureMode

from .conftest import alive, sandbox_tmp_root, until

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

OWNER = Path(__file__).with_name("service_owner.py")
SHELL = ShellConfig(command_timeout_s=30)


@pytest.fixture()
def base() -> Iterator[Path]:
    path = sandbox_tmp_root()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
async def service_provider(base: Path) -> AsyncIterator[LocalProvider]:
    """A local provider of a coordinator's run (its sandboxes in the run's service), closed after the test."""
    provider = LocalProvider(LocalProviderConfig(root=base / "trees", overlay=False), SHELL, base / "run")
    try:
        yield provider
    finally:
        await provider.close()


def mounts_under(root: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(root))]


def start_owner(base: Path, grace_s: float, overlay: bool = False) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    owner = subprocess.Popen([sys.executable, str(OWNER), str(base / "trees"), str(base / "run"), str(grace_s),
                              "overlay" if overlay else "ro"], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    line = owner.stdout.readline()
    assert line, f"the owner exited with {owner.wait()}"
    return owner, json.loads(line)


def kill9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def assert_nothing_left(root: Path, service: int, cgroups: list[str]) -> None:
    until(lambda: not alive(service), 30, f"the service {service} still runs")
    assert not tree_processes(root), tree_processes(root)
    assert not [p.name for p in root.iterdir() if p.name.startswith("sb-")]
    assert not mounts_under(root), mounts_under(root)
    assert not [c for c in cgroups if Path(c).exists()], cgroups


@pytest.mark.timeout(240)
async def test_sandboxes_outlive_a_kill_9_of_the_coordinator_and_are_reattached(base: Path) -> None:
    owner, info = start_owner(base, grace_s=120)
    kill9(owner)  # the coordinator dies; its service and sandbox live on
    record = SandboxRecord.from_json(info["record"])
    assert alive(info["service"]) and alive(info["holder"])

    provider = LocalProvider(LocalProviderConfig(root=base / "trees", service_grace_s=120, overlay=False), SHELL,
                             base / "run")
    assert provider.survives_coordinator
    sandbox = await provider.reattach(record)
    assert provider.service is not None and provider.service.pid == info["service"]  # the same service, reattached
    socket_mode = os.stat(base / "run" / SOCKET_NAME).st_mode
    assert stat.S_ISSOCK(socket_mode) and stat.S_IMODE(socket_mode) == 0o600
    shell = await sandbox.open_shell()
    found = await shell.run(f"cat /app/kept.txt; kill -0 {info['pid']} && echo alive")
    assert found.output.split("\n")[:2] == ["before the crash", "alive"], found.output
    verifier = await sandbox.open_shell(role=ShellRole.VERIFIER)
    seen = await verifier.run("id -u; cat /app/kept.txt")
    assert seen.output.split("\n")[1] == "before the crash" and seen.output.split("\n")[0] != "0", seen.output
    with pytest.raises(SandboxGone, match="already attached"):
        await provider.reattach(record)
    with pytest.raises(SandboxGone, match="not live in the sandbox service"):
        await provider.reattach(SandboxRecord("local", "sb-000000000000", record.data))
    health = await provider.service.health()
    assert health["attached"] == 1 and health["sandboxes"] == 2
    assert await provider.sweep_unclaimed(keep={info["other"]}) == 0  # one a resumed episode will still take
    assert await provider.sweep_unclaimed() == 1  # the other sandbox: nobody reattached it
    assert not await provider.service.has(info["other"]) and await provider.service.has(record.sandbox_id)
    assert (await shell.run("echo still")).output.strip() == "still"
    await provider.close()  # a clean stop: the service destroys everything and exits
    assert_nothing_left(base / "trees", info["service"], health["cgroups"])
    assert not alive(info["holder"])


@pytest.mark.timeout(240)
async def test_a_kill_9_of_the_service_ends_its_sandboxes_and_the_next_create_starts_another(
        service_provider: LocalProvider, base: Path) -> None:
    provider = service_provider
    sandbox = await provider.create(SandboxRequest())
    shell = await sandbox.open_shell()
    await shell.run("setsid sleep 300 > /dev/null 2>&1 < /dev/null &")
    assert provider.service is not None and provider.service.pid is not None
    target = await provider.service.target(sandbox.id)
    assert target is not None and len(tree_processes(base / "trees")) >= 2
    service = provider.service.pid
    os.kill(service, signal.SIGKILL)
    until(lambda: not alive(target.pid) and not tree_processes(base / "trees"), 10,
          f"the sandbox's processes outlived their service: {tree_processes(base / 'trees')}")
    with pytest.raises(SandboxLost):
        await shell.run("echo still here")
    await provider.destroy(sandbox)  # nothing to do: the sandbox died with the service
    again = await provider.create(SandboxRequest())  # a new service, which swept what the dead one left
    assert provider.service.pid != service
    assert (await (await again.open_shell()).run("echo ok")).output.strip() == "ok"
    assert [p.name for p in (base / "trees").iterdir() if p.name.startswith("sb-")] == [again.id]


@pytest.mark.slow  # a grace period to wait out and a service to start: about 6 s here
@pytest.mark.timeout(240)
def test_a_service_no_coordinator_attaches_to_sweeps_everything_after_its_grace(base: Path) -> None:
    owner, info = start_owner(base, grace_s=2)
    root = base / "trees"
    assert tree_processes(root)
    kill9(owner)
    time.sleep(1)
    assert alive(info["service"]) and alive(info["holder"]), "the grace period has not ended yet"
    until(lambda: not alive(info["service"]), 30, "the orphaned service did not exit after its grace period")
    assert_nothing_left(root, info["service"], info["cgroups"])
    assert not (base / "run" / SOCKET_NAME).exists()


async def test_control_errors_name_what_is_wrong(base: Path) -> None:
    provider = LocalProvider(LocalProviderConfig(root=base / "trees", overlay=False, bubblewrap=False), SHELL,
                             base / "run")
    try:
        await provider.start()
        service = provider.service
        assert service is not None
        with pytest.raises(SandboxGone, match="sb-nope is not live"):
            await service.end_setup("sb-nope")
        with pytest.raises(RuntimeError, match="unknown op 'fly'"):
            await service.call("fly")
        with pytest.raises(RuntimeError, match="'env' must be a list"):
            await service.call("create", request={"env": "PATH=/"})
        with pytest.raises(RuntimeError, match="sandbox service process"):
            provider.tree("sb-nope")
    finally:
        await provider.close()


@pytest.mark.timeout(240)
async def test_a_sandbox_lost_with_its_service_is_t1s_fault_even_after_the_agent_acted(
        service_provider: LocalProvider) -> None:
    provider = service_provider
    sandbox = await provider.create(SandboxRequest())
    shell = await sandbox.open_shell()
    assert (await shell.run("echo acted")).exit_code == 0
    kept = await provider.create(SandboxRequest())
    assert isinstance(kept, SshSandbox) and provider.service is not None
    await provider.backend.destroy(kept.id)  # this sandbox alone ends; the service runs on
    with pytest.raises(SandboxLost) as own:
        await (await kept.open_shell()).run("echo gone")
    assert await lost_cause(kept, own.value) is own.value  # not the service's death: the usual rule holds
    assert attempt_failure(own.value, agent_acted=True) is FailureMode.SANDBOX_DIED
    assert provider.service.pid is not None
    os.kill(provider.service.pid, signal.SIGKILL)
    with pytest.raises(SandboxLost) as lost:
        await shell.run("echo again")
    cause = await lost_cause(sandbox, lost.value)
    assert isinstance(cause, SandboxHostLost) and "sandbox service" in str(cause)
    assert attempt_failure(cause, agent_acted=True) is None  # an infra error, never a reward


@pytest.mark.slow  # two services started: about 4 s here
async def test_a_service_started_ahead_is_the_one_the_provider_attaches_to_or_is_stopped(base: Path) -> None:
    cfg = LocalProviderConfig(root=base / "trees", overlay=False)
    spawn_service(cfg, base / "run")  # the coordinator's first step
    spawn_service(cfg, base / "run")  # a second call while it starts starts nothing
    provider = LocalProvider(cfg, SHELL, base / "run")
    try:
        await provider.start()
        assert provider.service is not None
        assert (await provider.service.health())["attached"] == 1
    finally:
        await provider.close()
    assert not alive(provider.service.pid or 0)
    spawn_service(cfg, base / "run")  # a coordinator that failed before its provider attached
    await stop_spawned(cfg, base / "run")
    until(lambda: not (base / "run" / SOCKET_NAME).exists(), 10, "the service started ahead to stop")


@pytest.mark.slow  # a grace period waited out twice: about 6 s here
@pytest.mark.timeout(240)
def test_a_coordinator_that_holds_the_run_dir_keeps_the_service_past_its_grace(base: Path) -> None:
    owner, info = start_owner(base, grace_s=1)
    kill9(owner)
    lock = os.open(base / "run" / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a restarted coordinator that has not attached yet (DirLock first)
        time.sleep(3)
        assert alive(info["service"]) and alive(info["holder"]), "swept while the run's coordinator was starting"
    finally:
        os.close(lock)  # that coordinator died too
    until(lambda: not alive(info["service"]), 30, "the service outlived its grace period with nobody holding the run")
    assert_nothing_left(base / "trees", info["service"], info["cgroups"])
