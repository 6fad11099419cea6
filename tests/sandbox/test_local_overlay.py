"""A local sandbox's copy-on-write root: writable anywhere, never the host, bounded, gone on destroy.

Every test runs real sandboxes of the local provider (bubblewrap over an overlay of the host's
root, T1 as root) and checks the host itself, not what the sandbox reports about it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from t1.sandbox.isolation.bwrap import sweep_tree
from t1.sandbox.isolation.mountns import mount
from t1.sandbox.isolation.rootfs import _locked
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxRequest, ShellRole

from .conftest import provider_with

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the overlay root needs T1 running as root"),
]


@pytest.fixture
async def provider() -> AsyncIterator[LocalProvider]:
    async with provider_with(storage_mb=256, overlay=True) as provider:
        yield provider


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _mounts_naming(path: Path) -> list[str]:
    """Every process's mount table line that names `path` (what a leaked overlay or tmpfs would leave)."""
    hits = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/mountinfo") as mountinfo:
                hits += [f"{pid}: {line.strip()}" for line in mountinfo if str(path) in line]
        except OSError:
            continue
    return hits


def _shmem_kib() -> int:
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) for line in meminfo if line.startswith("Shmem:"))


async def test_writes_anywhere_stay_in_the_sandbox(provider: LocalProvider) -> None:
    passwd, bash = _digest("/etc/passwd"), _digest("/usr/bin/bash")
    shell = await (await provider.create(SandboxRequest())).open_shell()
    wrote = await shell.run(
        "set -e; mkdir -p /custom-workdir; echo top > /t1-top; echo tool > /usr/bin/t1-tool; chmod +x /usr/bin/t1-tool;"
        " echo 'intruder:x:4242:4242::/:/bin/sh' >> /etc/passwd; echo clobbered > /usr/bin/bash.t1;"
        " cp /usr/bin/true /tmp/t1-moved && mv /tmp/t1-moved /usr/local/bin/t1-moved; mkdir -p /data/output;"
        " echo ok")
    assert wrote.exit_code == 0 and wrote.output.strip() == "ok", wrote
    seen = await shell.run("cat /t1-top /usr/bin/t1-tool; grep -c intruder /etc/passwd; /usr/local/bin/t1-moved && "
                           "echo ran;"
                           " ls -d /custom-workdir /data/output")
    assert seen.output.split() == ["top", "tool", "1", "ran", "/custom-workdir", "/data/output"], seen
    for path in [
        "/custom-workdir",
        "/t1-top",
        "/usr/bin/t1-tool",
        "/usr/bin/bash.t1",
        "/usr/local/bin/t1-moved",
        "/data/output",
    ]:
        assert not os.path.lexists(path), f"{path} reached the host"
    assert _digest("/etc/passwd") == passwd and _digest("/usr/bin/bash") == bash


async def test_users_can_be_added_and_used(provider: LocalProvider) -> None:
    shell = await (await provider.create(SandboxRequest())).open_shell()
    made = await shell.run(
        "useradd -m -s /bin/bash alice && adduser --disabled-password --gecos '' bob >/dev/null &&"
        " mkdir /srv/data && chown alice:alice /srv/data && stat -c %U:%G /srv/data /home/alice /home/bob")
    assert made.exit_code == 0 and made.output.split() == ["alice:alice", "alice:alice", "bob:bob"], made
    as_alice = await shell.run("su alice -c 'id -un; touch /srv/data/f; echo $HOME'; runuser -u bob -- id -un;"
                               " stat -c %U /srv/data/f; su bob -c 'touch /srv/data/g' 2>&1 | grep -c 'Permission "
                               "denied'")
    assert as_alice.output.split() == ["alice", "/home/alice", "bob", "alice", "1"], as_alice
    host_passwd = Path("/etc/passwd").read_text()
    assert "alice:" not in host_passwd and "bob:" not in host_passwd and not os.path.exists("/home/alice")


async def test_two_sandboxes_never_see_each_others_writes(provider: LocalProvider) -> None:
    one = await (await provider.create(SandboxRequest())).open_shell()
    two = await (await provider.create(SandboxRequest())).open_shell()
    await one.run("echo one > /etc/t1-mine; echo one > /usr/bin/t1-mine; rm -f /etc/motd; useradd carol")
    fresh = await two.run("ls /etc/t1-mine /usr/bin/t1-mine 2>&1 | grep -c 'No such file'; id carol 2>&1 | grep -c 'no "
                          "such user'")
    assert fresh.output.split() == ["2", "1"], fresh
    await two.run("echo two > /etc/t1-mine")
    mine = await one.run("cat /etc/t1-mine")
    theirs = await two.run("cat /etc/t1-mine")
    assert mine.output.strip() == "one" and theirs.output.strip() == "two"
    if os.path.exists("/etc/motd"):
        assert (await two.run("test -e /etc/motd && echo kept")).output.strip() == "kept"


async def test_every_shell_of_a_sandbox_shares_its_root(provider: LocalProvider, tmp_path: Path) -> None:
    box = await provider.create(SandboxRequest())
    first = await box.open_shell()
    await first.run("printf '#!/bin/sh\\necho shared-tool\\n' > /usr/local/bin/t1-shared; chmod +x "
                    "/usr/local/bin/t1-shared")
    second = await box.open_shell()
    terminal = await box.open_shell(terminal=True)
    assert (await second.run("t1-shared")).output.strip() == "shared-tool"
    assert "shared-tool" in (await terminal.run("t1-shared")).output
    local = tmp_path / "up.txt"
    local.write_text("uploaded\n")
    await box.upload(str(local), "/etc/t1-uploaded")
    assert (await second.run("cat /etc/t1-uploaded")).output.strip() == "uploaded"
    await box.download("/usr/local/bin/t1-shared", str(tmp_path / "down"))
    assert "shared-tool" in (tmp_path / "down").read_text()


async def test_tree_dirs_are_reachable_from_the_host(provider: LocalProvider) -> None:
    box = await provider.create(SandboxRequest())
    await (await box.open_shell()).run("echo data > /app/a; echo h > ~/h; echo l > /logs/l")
    assert (provider.host_path(box.id, "app") / "a").read_text() == "data\n"
    assert (provider.host_path(box.id, "home") / "h").read_text() == "h\n"
    (provider.host_path(box.id, "tests") / "t").write_text("from host\n")
    verifier = await box.open_shell(role=ShellRole.VERIFIER)  # /tests is the verifier's alone
    assert (await verifier.run("cat /tests/t")).output.strip() == "from host"


async def test_destroy_frees_the_layer(provider: LocalProvider) -> None:
    box = await provider.create(SandboxRequest())
    root = provider.tree(box.id).root
    shell = await box.open_shell()
    before = _shmem_kib()
    wrote = await shell.run("head -c 200000000 /dev/zero > /usr/t1-big && head -c 20000000 /dev/zero > /app/big && "
                            "echo ok")
    assert wrote.output.strip() == "ok", wrote
    assert _shmem_kib() - before > 180_000, "the writes should sit in the sandbox's tmpfs"
    assert _mounts_naming(root), "the sandbox's mounts should be visible in its own namespaces"
    await provider.destroy(box)
    for _ in range(50):
        if _shmem_kib() < before + 40_000 and not _mounts_naming(root):
            break
        await asyncio.sleep(0.1)
    assert _mounts_naming(root) == [], "a mount of the destroyed sandbox is left"
    assert _shmem_kib() < before + 40_000, "the destroyed sandbox's memory was not returned"
    assert not root.exists()


async def test_writing_past_the_storage_limit_gets_enospc(provider: LocalProvider) -> None:
    box = await provider.create(SandboxRequest(storage_mb=32))
    shell = await box.open_shell()
    free_before = shutil.disk_usage("/").free
    for path in ["/usr/t1-fill", "/app/fill", "/tmp/fill", "/root/fill"]:
        full = await shell.run(f"dd if=/dev/zero of={path} bs=1M count=1024 2>&1; rm -f {path}")
        assert "No space left on device" in full.output, (path, full)
    many = await shell.run("for i in $(seq 40); do head -c 1000000 /dev/zero > /etc/t1-$i || { echo full; break; }; "
                           "done")
    assert "full" in many.output
    assert free_before - shutil.disk_usage("/").free < 512 * 2**20, "the host's disk took the sandbox's writes"
    df = await shell.run("df -m / | tail -1")
    assert int(df.output.split()[1]) <= 32, df


async def test_a_storage_request_above_the_limit_is_refused(provider: LocalProvider) -> None:
    with pytest.raises(ValueError, match=r"storage_mb=999999.*max_storage_mb"):
        await provider.create(SandboxRequest(storage_mb=999_999))


async def test_host_secrets_and_private_dirs_stay_hidden(provider: LocalProvider) -> None:
    shell = await (await provider.create(SandboxRequest())).open_shell()
    keys = sorted(str(p) for p in Path("/etc/ssh").glob("ssh_host_*_key"))
    for key in keys:
        assert (await shell.run(f"stat -c %s {key}")).output.strip() == "0", key
    shadow = await shell.run("cut -d: -f2 /etc/shadow | sort -u")
    assert set(shadow.output.split()) <= {"*", "!"}, shadow
    assert (await shell.run("ls -A /root /home | grep -v : | wc -w")).output.strip() == "0"
    for top in sorted(set(os.listdir("/")) - {"usr", "etc", "opt", "var", "bin", "sbin", "lib", "lib32", "lib64",
                                              "libx32", "proc", "dev", "run", "sys", "home", "mnt", "srv", "media",
                                              "root", "tmp", "app", "logs", "tests"}):
        probe = await shell.run(f"ls -d /{top}")
        assert "No such file" in probe.output, top


def test_locked_shadow_keeps_every_field_but_the_password() -> None:
    text = b"root:$6$salt$hash:20228:0:99999:7:::\nbob:!$6$x:1:0:99999:7:::\ndaemon:*:20228:0:99999:7:::\n"
    assert _locked(text) == b"root:*:20228:0:99999:7:::\nbob:!:1:0:99999:7:::\ndaemon:*:20228:0:99999:7:::\n"


def test_sweep_tree_unmounts_and_removes_a_stale_tree(tmp_path: Path) -> None:
    """A dead run's tree with mounts left in this namespace (tmpfs, and one nested in it) is swept."""
    stale = tmp_path / "sb-dead"
    (stale / "layer").mkdir(parents=True)
    mount("tmpfs", str(stale / "layer"), "tmpfs", 0, "size=1m")
    (stale / "layer" / "rootfs").mkdir()
    mount("tmpfs", str(stale / "layer" / "rootfs"), "tmpfs", 0, "size=1m")
    (stale / "layer" / "rootfs" / "file").write_text("x")
    sweep_tree(stale)
    assert not stale.exists()
    with open("/proc/self/mountinfo") as mountinfo:
        assert str(stale) not in mountinfo.read()


async def test_a_failed_overlay_start_leaves_no_process(
    provider: LocalProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If mounting the overlay fails, the create fails naming it, and bubblewrap's waiting child dies too."""
    import t1.sandbox.isolation.nsinit as nsinit

    def broken(root: Path, userns_fd: int) -> None:
        raise OSError(22, f"mount overlay on {root}: Invalid argument")

    monkeypatch.setattr(nsinit, "mount_overlay", broken)
    before = set(os.listdir("/proc"))
    with pytest.raises(RuntimeError, match=r"copy-on-write root failed.*Invalid argument.*overlay: false"):
        await asyncio.wait_for(provider.create(SandboxRequest()), 30)
    await asyncio.sleep(0.3)
    ours = {str(os.getpid()), "1"}  # our children, or orphans left to the host's init
    left = [pid for pid in set(os.listdir("/proc")) - before if pid.isdigit() and _bwrap_parent(pid) in ours]
    assert left == [], f"bubblewrap processes left: {left}"


def _bwrap_parent(pid: str) -> str:
    """The parent pid of `pid` if it is a live bubblewrap, else ''."""
    try:
        status = dict(
            line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line
        )
    except OSError:
        return ""
    alive = status.get("Name") == "bwrap" and not status.get("State", "").startswith("Z")
    return status.get("PPid", "").strip() if alive else ""
