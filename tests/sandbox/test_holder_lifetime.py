"""Issue 19 case 3: a local sandbox's processes do not outlive the T1 process that owns it, and the next
start kills what a dead run left. Real bubblewrap, real kill -9, the owner a separate process
(tests/sandbox/holder_owner.py)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.isolation.holders import HOLDER_NAME, tree_processes
from t1.sandbox.isolation.netns import SLIRP
from t1.sandbox.local.local_provider import LocalProvider

from .conftest import alive, sandbox_tmp_root, until

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

OWNER = Path(__file__).with_name("holder_owner.py")


@pytest.fixture()
def root() -> Iterator[Path]:
    path = sandbox_tmp_root()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _pid_ns(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/pid").st_ino


def _members(namespaces: set[int]) -> list[int]:
    """Live processes in any of these PID namespaces."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if _pid_ns(int(entry.name)) in namespaces and alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


def _start_owner(root: Path, mode: str) -> tuple[subprocess.Popen[str], list[int]]:
    owner = subprocess.Popen([sys.executable, str(OWNER), str(root), mode], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    line = owner.stdout.readline().split()
    assert line and line[0] == "ready", f"owner exited with {owner.wait()}"
    return owner, [int(p) for p in line[1:]]


def _kill9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


@pytest.mark.timeout(180)
def test_every_process_of_its_sandboxes_dies_within_seconds_of_a_kill_9_of_the_owner(root: Path) -> None:
    owner, inits = _start_owner(root, "sandboxes")
    try:
        namespaces = {_pid_ns(pid) for pid in inits}
        before = _members(namespaces)
        assert len(namespaces) == 2 and len(before) >= 6, before  # per sandbox: holder, the job, the daemon
        assert tree_processes(root / "overlay") and tree_processes(root / "ro")
        # On the host, outside the sandbox's namespaces: its user-mode network.
        slirps = [pid for pid in _children(owner.pid) if Path(f"/proc/{pid}/comm").read_text().strip() == SLIRP]
        assert len(slirps) == (shutil.which(SLIRP) is not None)
    finally:
        _kill9(owner)
    until(lambda: not _members(namespaces), 5, f"left in the sandboxes: {_members(namespaces)}")
    until(lambda: not any(alive(pid) for pid in slirps), 5, f"{SLIRP} left: {slirps}")
    until(lambda: not tree_processes(root / "overlay") and not tree_processes(root / "ro"), 5,
           f"left for the trees: {tree_processes(root / 'overlay') + tree_processes(root / 'ro')}")


@pytest.mark.timeout(180)
def test_holders_end_with_the_lifeline_pipe_itself(root: Path) -> None:
    """Without relying on bubblewrap's parent-death signal: the owner stays alive, only its lifeline ends."""
    owner, inits = _start_owner(root, "lifeline-closed")
    try:
        namespaces = {_pid_ns(pid) for pid in inits}  # before the lifeline closes: its holders end within ms
        assert len(namespaces) == 2 and owner.stdin is not None and owner.stdout is not None
        owner.stdin.write("close\n")
        owner.stdin.flush()
        assert owner.stdout.readline().strip() == "closed"
        until(lambda: not _members(namespaces), 5, f"left in the sandboxes: {_members(namespaces)}")
        assert owner.poll() is None, "the owner itself is alive: the pipe alone ended its sandboxes"
    finally:
        _kill9(owner)


@pytest.mark.timeout(180)
async def test_the_next_start_kills_what_a_dead_run_left_then_removes_its_trees(
        root: Path, caplog: pytest.LogCaptureFixture) -> None:
    owner, (keeper, outer) = _start_owner(root, "stuck-bwrap")
    holder: subprocess.Popen[bytes] | None = None
    bystanders: list[subprocess.Popen[bytes]] = []
    try:
        child = int(Path(f"/proc/{outer}/task/{outer}/children").read_text().split()[0])
        _kill9(owner)
        until(lambda: not alive(outer), 5, "bubblewrap's outer process dies with its parent")
        time.sleep(0.5)
        assert alive(child), "bubblewrap's child is left blocked (the leftover this test is about)"
        (root / "sb-dead").mkdir()
        holder = subprocess.Popen(["bash", "-c", "sleep 3600; :", HOLDER_NAME, str(root / "sb-dead")],
                                  start_new_session=True)
        # Not this root's: a holder of another root (a live run's) and a process that only names the root.
        bystanders = [subprocess.Popen(["bash", "-c", "sleep 3600; :", HOLDER_NAME, where], start_new_session=True)
                      for where in (f"{root}-other/sb-live", str(root))]
        until(lambda: set(tree_processes(root)) == {child, holder.pid}, 5, f"found {tree_processes(root)}")
        caplog.set_level(logging.WARNING)
        provider = LocalProvider(LocalProviderConfig(root=root), ShellConfig())
        await provider.start()
        try:
            assert holder.wait(5) == -signal.SIGKILL
            assert not alive(child)
            assert not tree_processes(root)
            assert not (root / "sb-dead").exists() and not (root / "sb-stuck").exists()
            assert all(b.poll() is None for b in bystanders), "only the root's tree processes are killed"
            assert any("killed 2 sandbox processes" in r.getMessage() for r in caplog.records)
        finally:
            await provider.close()
    finally:
        if owner.poll() is None:
            _kill9(owner)
        for pid in (keeper, outer):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for group in [holder, *bystanders]:  # with their sleeps, which the sweep does not know
            if group is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group.pid, signal.SIGKILL)
                group.wait()
