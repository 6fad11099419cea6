"""A coordinator killed with -9 leaves containers; the next provider to start removes them (and only them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from private_dockerd import PrivateDockerd, docker_config
from test_docker_provider import t1_containers

from t1.config.sandbox import ShellConfig
from t1.sandbox.docker.docker_provider import DockerProvider
from t1.sandbox.types import SandboxRequest

OWNER = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from t1.config.sandbox import DockerProviderConfig, ShellConfig
    from t1.sandbox.docker.docker_provider import DockerProvider
    from t1.sandbox.types import SandboxRequest

    async def main():
        cfg = DockerProviderConfig(socket=Path(sys.argv[1]), default_image=sys.argv[2])
        provider = DockerProvider(cfg, ShellConfig())
        sandbox = await provider.create(SandboxRequest())
        print(sandbox.id, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


async def test_kill_9_leaves_no_container_after_next_start(dockerd: PrivateDockerd) -> None:
    live = DockerProvider(docker_config(dockerd), ShellConfig())
    mine = await live.create(SandboxRequest())  # a live owner's container must survive the sweep
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(dockerd.socket), docker_config(dockerd).default_image],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        dead_id = owner.stdout.readline().strip()
        assert dead_id.startswith("sb-"), dead_id
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    assert sorted(t1_containers(dockerd)) == sorted([f"t1-{mine.id}", f"t1-{dead_id}"])
    nxt = DockerProvider(docker_config(dockerd), ShellConfig())
    try:
        await nxt.start()
        assert t1_containers(dockerd) == [f"t1-{mine.id}"]
        shell = await mine.open_shell()
        assert (await shell.run("echo still")).output.strip() == "still"
    finally:
        await nxt.close()
        await live.close()
    assert t1_containers(dockerd) == []
