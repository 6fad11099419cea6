"""The verifier of an overlay sandbox runs the system as setup left it, and reads what the agent made.

Real local sandboxes (bubblewrap over an overlay of the host's root, T1 as root): a setup writes
the system, `end_setup` fixes it, the agent then writes the system and its work areas, and a
verifier shell is asked what it sees and runs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator

import pytest

from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxRequest, ShellRole

from .conftest import provider_with

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the overlay root needs T1 running as root"),
]

SETUP = ("mkdir -p /skills /usr/local/lib/t1probe && echo setup > /skills/s.txt && "
         "printf '#!/bin/sh\\necho setup-tool\\n' > /usr/local/bin/t1tool && chmod +x /usr/local/bin/t1tool && "
         "useradd -m alice && echo '127.0.0.2 setuphost' >> /etc/hosts")
AGENT = ("printf '#!/bin/sh\\necho agent-tool\\n' > /usr/local/bin/t1tool; "
         "printf '#!/bin/sh\\necho forged\\n' > /usr/local/bin/python3; chmod +x /usr/local/bin/python3; "
         "echo 'import sys; print(\"forged\")' > /usr/lib/python3/dist-packages/t1forge.pth; "
         "echo /usr/lib/nothing.so > /etc/ld.so.preload; echo 'echo forged' >> /etc/bash.bashrc; "
         "echo 't1-verifier:x:64999:64999::/app:/app/evil' >> /etc/passwd; useradd bob; "
         "echo '127.0.0.3 agenthost' >> /etc/hosts; mkdir -p /data/output && echo result > /data/output/r.txt; "
         "echo agent > /app/made.txt; echo top > /conftest.py; ln -s /data/output /results; echo agent done")
PROBE = ("t1tool; python3 -c 'print(\"real python\")'; cat /etc/ld.so.preload 2>&1 | head -1; "
         "grep -c forged /etc/bash.bashrc; getent passwd alice bob t1-verifier | cut -d: -f1,6; "
         "grep -h -e setuphost -e agenthost /etc/hosts; cat /skills/s.txt /data/output/r.txt /results/r.txt "
         "/app/made.txt; "
         "ls /conftest.py 2>&1 | head -1; ( echo x > /usr/local/bin/t1tool ) 2>&1 | grep -o 'Read-only file system'; "
         "echo v > /app/verifier.txt && cat /app/verifier.txt")


@pytest.fixture
async def provider() -> AsyncIterator[LocalProvider]:
    async with provider_with(storage_mb=256, overlay=True) as provider:
        yield provider


async def test_the_verifier_runs_the_system_setup_left_and_reads_the_agents_work(provider: LocalProvider) -> None:
    box = await provider.create(SandboxRequest())
    try:
        agent = await box.open_shell()
        assert (await agent.run(SETUP)).exit_code == 0
        await box.end_setup()
        assert "agent done" in (await agent.run(AGENT)).output
        assert (await agent.run("t1tool")).output.splitlines()[-1] == "agent-tool"  # the agent's view keeps its writes
        verifier = await box.open_shell(role=ShellRole.VERIFIER)
        seen = (await verifier.run(PROBE)).output.splitlines()
        assert seen == [
            "setup-tool", "real python", "cat: /etc/ld.so.preload: No such file or directory", "0",
            "alice:/home/alice", "bob:/home/bob", "t1-verifier:/tmp/.t1-verifier",
            "127.0.0.2 setuphost", "127.0.0.3 agenthost",
            "setup", "result", "result", "agent",
            "ls: cannot access '/conftest.py': No such file or directory", "Read-only file system", "v",
        ], seen
        assert (await agent.run("cat /app/verifier.txt")).output.splitlines()[-1] == "v"  # the work areas are shared
    finally:
        await provider.destroy(box)


async def test_before_end_setup_the_verifier_runs_the_hosts_system(provider: LocalProvider) -> None:
    box = await provider.create(SandboxRequest())
    try:
        agent = await box.open_shell()
        await agent.run("printf '#!/bin/sh\\necho agent\\n' > /usr/local/bin/t1tool; chmod +x /usr/local/bin/t1tool")
        verifier = await box.open_shell(role=ShellRole.VERIFIER)
        assert "t1tool: command not found" in (await verifier.run("t1tool")).output
        await box.end_setup()  # from here the agent's tool is the setup's: a fresh verifier session sees it
        again = await box.open_shell(role=ShellRole.VERIFIER)
        assert (await again.run("t1tool")).output.strip() == "agent"
        with pytest.raises(RuntimeError, match="already ended"):
            await box.end_setup()
    finally:
        await provider.destroy(box)
