"""The agent's root keeps a container's capabilities with a copy-on-write root, and they stop at the verifier.

An adversarial policy runs as root with chown, dac_override, fowner, setuid, setgid and kill (the
overlay's set) and tries everything those would allow in a single user namespace that maps the
verifier's uid: become it, write, chown or chmod its directories, read the tests, kill its shell.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator

import pytest

from t1.sandbox.isolation import agent_userns
from t1.sandbox.isolation.make_agent_userns import INNER_MAP
from t1.sandbox.isolation.rootfs import ID_COUNT
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxRequest, ShellRole
from t1.sandbox.verifier.verifier_role import VERIFIER_UID

from .conftest import provider_with

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the overlay root needs T1 running as root"),
]

CAP_BITS = {"chown": 0, "dac_override": 1, "fowner": 3, "kill": 5, "setgid": 6, "setuid": 7}


@pytest.fixture
async def provider() -> AsyncIterator[LocalProvider]:
    async with provider_with(storage_mb=256, overlay=True) as provider:
        yield provider


def test_maps_give_the_verifier_uid_to_the_outer_namespace_only() -> None:
    base, verifier = 7 * ID_COUNT, 9 * ID_COUNT
    outer = [tuple(map(int, line.split())) for line in agent_userns.outer_map(base, verifier).splitlines()]
    inner = [tuple(map(int, line.split())) for line in INNER_MAP.splitlines()]
    assert sum(n for _, _, n in outer) == ID_COUNT and (VERIFIER_UID, verifier, 1) in outer
    assert all(host != verifier or uid == VERIFIER_UID for uid, host, _ in outer)
    assert all(uid == to for uid, to, _ in inner) and sum(n for _, _, n in inner) == ID_COUNT - 1
    assert all(not start <= VERIFIER_UID < start + n for start, _, n in inner)


async def test_agent_with_root_caps_cannot_reach_the_verifier(provider: LocalProvider) -> None:
    box = await provider.create(SandboxRequest())
    assert provider.tree(box.id).overlay
    agent, verifier = await box.open_shell(), await box.open_shell(role=ShellRole.VERIFIER)
    await verifier.run("echo secret > /tests/test_x.py; echo 1 > /logs/verifier/reward.txt")

    # the agent is a container's root: its capabilities work on its own files and users
    caps = int((await agent.run("grep CapEff /proc/self/status | cut -f2")).output.strip(), 16)
    assert all(caps >> bit & 1 for bit in CAP_BITS.values()), hex(caps)
    own = await agent.run("useradd -m u1 && touch /app/f && chown u1:u1 /app/f && stat -c %U /app/f && "
                          "chmod 600 /app/f && runuser -u u1 -- id -un && echo ok")
    assert own.exit_code == 0 and own.output.split() == ["u1", "u1", "ok"], own.output
    port = await agent.run("python3 -c \"import socket; socket.socket().bind(('127.0.0.1', 80)); print('bound')\"")
    assert port.output.strip() == "bound", port.output  # a container's root serves on port 80

    # ... and nowhere on the verifier's uid, files or processes
    become = await agent.run(f"setpriv --reuid {VERIFIER_UID} --regid {VERIFIER_UID} --clear-groups id -u; echo rc=$?")
    assert "rc=0" not in become.output and f"\n{VERIFIER_UID}\n" not in f"\n{become.output}", become.output
    mapped = [tuple(map(int, line.split())) for line in (await agent.run("cat /proc/self/uid_map")).output.splitlines()]
    assert mapped and all(not start <= VERIFIER_UID < start + n for start, _, n in mapped), mapped
    for path in ("/tests", "/logs/verifier"):
        attack = await agent.run(
            f"echo forged > {path}/reward.txt; echo w=$?; cat {path}/*; echo r=$?; chown root:root {path}; echo c=$?; "
            f"chmod 777 {path}; echo m=$?; rm -rf {path}/*; echo d=$?; mv {path} /app/x; echo v=$?")
        for code in ("w", "r", "c", "m", "v"):
            assert f"{code}=0" not in attack.output, (path, attack.output)
    check = await verifier.run("cat /tests/test_x.py /logs/verifier/reward.txt; stat -c '%a %u' /tests /logs/verifier")
    assert check.output.split() == ["secret", "1", "700", str(VERIFIER_UID), "700", str(VERIFIER_UID)], check.output
    sleeper = (await verifier.run("sleep 300 >/dev/null 2>&1 & echo $!")).output.strip()
    kill = await agent.run(f"kill -9 {sleeper}; echo k=$?; kill -9 1; echo k1=$?")
    assert "k=0" not in kill.output, kill.output
    assert (await verifier.run(f"kill -0 {sleeper} && echo alive")).output.strip() == "alive"
    assert (await agent.run("echo still; ps -o stat= -p 1")).exit_code == 0  # the init is alive too
