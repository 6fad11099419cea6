"""The verifier role on the local provider: a uid of its own per sandbox, out of the agent's reach, in its world.

The agent (root of the sandbox, without capabilities) tries what a policy would: signal and
ptrace the verifier's shell and the sandbox's PID 1. All fail. The verifier sees the agent's
processes and files and may write them, as a root verifier in a container would.
"""

from __future__ import annotations

import os
import shutil

import pytest

from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxRequest, ShellRole
from t1.sandbox.verifier import enter_verifier, verifier_role
from t1.tasks.toolchain import TOOLCHAIN_DIR

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

PTRACE = "python3 -c \"import ctypes,sys; print('ptrace', ctypes.CDLL(None).ptrace(16, int(sys.argv[1]), 0, 0))\""


def test_the_helper_and_the_role_agree() -> None:
    assert enter_verifier.VERIFIER_UID == verifier_role.VERIFIER_UID
    assert enter_verifier.VERIFIER_HOME == verifier_role.VERIFIER_HOME == TOOLCHAIN_DIR
    assert enter_verifier.ETC_DIR == verifier_role.ETC_DIR
    assert set(verifier_role.VERIFIER_CAPS) <= set(enter_verifier.CAP_NUMBERS)


async def test_agent_cannot_signal_or_trace_the_verifier_or_init(local_provider: LocalProvider) -> None:
    first, second = await local_provider.create(SandboxRequest()), await local_provider.create(SandboxRequest())
    trees = [local_provider.tree(b.id) for b in (first, second)]
    uids = {t.uid for t in trees} | {t.verifier_uid for t in trees}
    assert len(uids) == 4  # a verifier uid of its own per sandbox, none shared with an agent
    agent, verifier = await first.open_shell(), await first.open_shell(role=ShellRole.VERIFIER)
    me = await verifier.run("id -un; echo $$; sleep 300 >/dev/null 2>&1 & echo $!")
    name, shell_pid, sleeper = me.output.split()
    assert name == "t1-verifier"
    for pid in (shell_pid, sleeper):
        attack = await agent.run(f"kill -9 {pid}; echo kill=$?; kill -STOP {pid}; echo stop=$?; {PTRACE} {pid}")
        assert "kill=1" in attack.output and "stop=1" in attack.output and "ptrace -1" in attack.output, attack.output
    # PID 1: the kernel drops signals to a namespace's init that it has no handler for, and ptrace is refused
    init = await agent.run(f"kill -9 1; kill -STOP 1; {PTRACE} 1; sleep 0.5; ps -o stat= -p 1")
    assert "ptrace -1" in init.output and init.output.split()[-1].startswith("S"), init.output
    alive = await verifier.run(f"kill -0 {sleeper} && echo alive")
    assert alive.output.strip() == "alive"
    await agent.run("echo agent > /app/owned-by-agent; chmod 600 /app/owned-by-agent; mkdir -p /app/build")
    edit = await verifier.run("cat /app/owned-by-agent && echo verifier >> /app/owned-by-agent && "
                              "rm -rf /app/build && ps -eo user= | sort -u | tr '\\n' ' '")
    assert edit.exit_code == 0 and edit.output.startswith("agent\n"), edit.output
    assert "root" in edit.output and "t1-verifier" in edit.output  # it sees the agent's processes
    assert (await agent.run("cat /app/owned-by-agent")).output == "agent\nverifier\n"
    # nothing of the host beyond the sandbox's view: with a copy-on-write root the sandbox's own
    # shadow (every password locked) and /usr (writes land in its layer), else the host's, read-only
    host = await verifier.run("cat /etc/shadow; touch /usr/t1-x")
    assert not os.path.exists("/usr/t1-x")
    if local_provider.tree(first.id).overlay:
        hashes = [line.split(":")[1] for line in host.output.splitlines() if line.count(":") > 2]
        assert hashes and all(h in ("*", "!") for h in hashes), host.output
    else:
        assert host.exit_code != 0 and "Permission denied" in host.output
