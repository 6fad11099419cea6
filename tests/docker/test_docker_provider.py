"""The docker provider on a real, private Docker engine: lifecycle, limits, network, image policy."""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import tempfile
from pathlib import Path

import pytest
from private_dockerd import PrivateDockerd, docker_config

from t1.config.sandbox import ShellConfig
from t1.sandbox.docker.docker_engine import LABEL_SANDBOX, START_ATTEMPTS
from t1.sandbox.docker.docker_provider import DockerProvider
from t1.sandbox.needs import NeedsImageError
from t1.sandbox.ssh.ssh_sandbox import SshSandbox
from t1.sandbox.types import SandboxRequest

FORKS = b"""
import os, signal, time
pids = []
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        pids.append(pid)
except OSError as exc:
    print("refused", exc.errno)
for pid in pids:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print("forked", len(pids))
"""


def t1_containers(dockerd: PrivateDockerd) -> list[str]:
    with contextlib.closing(dockerd.client()) as client:
        return [c.name for c in client.containers.list(all=True, filters={"label": LABEL_SANDBOX})]


async def test_create_exec_destroy(docker_provider: DockerProvider, dockerd: PrivateDockerd) -> None:
    sandbox = await docker_provider.create(SandboxRequest())
    assert isinstance(sandbox, SshSandbox)
    shell = await sandbox.open_shell()
    first = await shell.run("cd /tmp && export MARK=kept && echo hi > f && hostname")
    assert first.exit_code == 0 and first.output.strip() == "sandbox"
    again = await shell.run("pwd; echo $MARK; cat f; exit 3")
    assert again.output.split() == ["/tmp", "kept", "hi"] and again.exit_code == 3
    # The shell sees the container's own root (the image), not the host's.
    probe = await shell.run("test -e /work && echo host-root || echo image-root; ls /usr/bin | wc -l")
    assert probe.output.split()[0] == "image-root"
    slow = await shell.run("sleep 30", timeout_s=1)
    assert slow.timed_out
    await shell.write_file("/app/up.txt", b"payload\n")
    assert await shell.read_file("/app/up.txt") == b"payload\n"
    with tempfile.TemporaryDirectory() as tmp:
        await sandbox.download("/app/up.txt", os.path.join(tmp, "down.txt"))
        assert Path(tmp, "down.txt").read_bytes() == b"payload\n"
    assert t1_containers(dockerd) == [f"t1-{sandbox.id}"]
    await docker_provider.destroy(sandbox)
    assert t1_containers(dockerd) == []


async def test_sandboxes_are_apart(docker_provider: DockerProvider) -> None:
    a = await docker_provider.create(SandboxRequest())
    b = await docker_provider.create(SandboxRequest())
    sa, sb = await a.open_shell(), await b.open_shell()
    await sa.run("echo secret > /app/a.txt; sleep 300 &")
    seen = await sb.run("cat /app/a.txt 2>&1; ps -e -o args= | grep -c '^sleep 300'")
    assert "No such file" in seen.output and seen.output.split()[-1] == "0"


async def test_memory_limit_holds(docker_provider: DockerProvider) -> None:
    sandbox = await docker_provider.create(SandboxRequest(memory_mb=64))
    shell = await sandbox.open_shell()
    # 200 MiB touched in one process: the container's memory cgroup (64 MiB, no swap) kills it.
    await shell.write_file("/tmp/hog.py", b"b = bytearray(200 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
                                          b"print('held')\n")
    hog = await shell.run("python3 /tmp/hog.py; echo rc=$?", timeout_s=60)
    assert "held" not in hog.output and "rc=137" in hog.output
    after = await shell.run("echo alive")
    assert after.output.strip() == "alive"


async def test_process_limit_holds(docker_provider: DockerProvider) -> None:
    sandbox = await docker_provider.create(SandboxRequest())
    shell = await sandbox.open_shell()
    # pids=64 for the whole container: forking 200 sleepers is refused before 64, whatever the shell does.
    await shell.write_file("/tmp/forks.py", FORKS)
    fork = await shell.run("python3 /tmp/forks.py", timeout_s=60)
    assert "refused" in fork.output, fork.output
    assert int(fork.output.split()[-1]) < 64
    assert (await shell.run("echo alive")).output.strip() == "alive"


async def test_no_network_by_default(docker_provider: DockerProvider) -> None:
    sandbox = await docker_provider.create(SandboxRequest())
    shell = await sandbox.open_shell()
    links = await shell.run("ls /sys/class/net")
    assert links.output.split() == ["lo"]
    dial = await shell.run("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 22), 2)' 2>&1; "
                           "python3 -c 'import socket; socket.create_connection((\"10.0.0.1\", 80), 2)' 2>&1")
    assert "Network is unreachable" in dial.output and dial.exit_code != 0


async def test_missing_image_is_needs_image(docker_provider: DockerProvider, dockerd: PrivateDockerd) -> None:
    with pytest.raises(NeedsImageError, match=r"image t1-absent:1\.0 is not on the Docker engine"):
        await docker_provider.create(SandboxRequest(docker_image="t1-absent:1.0"))
    assert t1_containers(dockerd) == []


async def test_a_first_process_that_cannot_start_leaves_no_container(docker_provider: DockerProvider,
                                                                    dockerd: PrivateDockerd) -> None:
    """An image without /bin/bash: the engine's start fails (`stat /bin/bash: no such file or directory`) every
    time; the provider tries START_ATTEMPTS times, says why, and leaves no container behind (it left each)."""
    info = tarfile.TarInfo("etc/t1-only")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(info, io.BytesIO(b""))
    with contextlib.closing(dockerd.client()) as client:
        client.api.import_image_from_data(buf.getvalue(), repository="t1-no-bash", tag="1")
    try:
        with pytest.raises(RuntimeError, match=rf"did not start {START_ATTEMPTS} times: .*/bin/bash.*no such file"):
            await docker_provider.create(SandboxRequest(docker_image="t1-no-bash:1"))
        assert t1_containers(dockerd) == []
    finally:
        with contextlib.closing(dockerd.client()) as client:
            client.images.remove("t1-no-bash:1")


async def test_pull_that_cannot_reach_a_registry_is_needs_image(dockerd: PrivateDockerd) -> None:
    provider = DockerProvider(docker_config(dockerd, pull=True), ShellConfig())
    try:
        # A registry on a closed loopback port: the pull fails without traffic leaving the machine.
        with pytest.raises(NeedsImageError, match=r"127\.0\.0\.1:1/t1-absent:2\.0 .* cannot be pulled"):
            await provider.create(SandboxRequest(docker_image="127.0.0.1:1/t1-absent:2.0"))
    finally:
        await provider.close()


async def test_storage_mb_is_enforced_or_said_not_to_be(docker_provider: DockerProvider, dockerd: PrivateDockerd,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    with contextlib.closing(dockerd.client()) as client:
        backing = dict(client.info()["DriverStatus"]).get("Backing Filesystem")
    sandbox = await docker_provider.create(SandboxRequest(storage_mb=64))
    shell = await sandbox.open_shell()
    wrote = await shell.run("dd if=/dev/zero of=/app/big bs=1M count=100 2>&1; echo rc=$?", timeout_s=60)
    assert docker_provider.engine is not None
    if docker_provider.engine.storage_quota:  # overlay2 on xfs with pquota: the write stops at 64 MiB
        assert "rc=1" in wrote.output and "No space left" in wrote.output, wrote.output
    else:  # this machine (overlay2 on ext4): created without a size, and the provider said so
        assert backing != "xfs" and "rc=0" in wrote.output
        assert "enforces no storage_mb" in caplog.text
