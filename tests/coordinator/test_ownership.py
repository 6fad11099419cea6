"""Issue 19 case 3: one owner per directory, children that die with their parent, and a start-up sweep
of sandbox trees a dead run left. Real processes, real flock, real kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml

from t1.sandbox.local.local_host import sweep_trees
from t1.workdir import DirectoryBusy, DirLock, SharedDirLock

_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from t1.workdir import DirLock, SharedDirLock
    lock = DirLock(Path(sys.argv[1]), "t1-trainer") if sys.argv[2] == "x" else SharedDirLock(Path(sys.argv[1]))
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
""")


def _hold(directory: Path, mode: str = "x") -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(directory), mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _kill9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def test_a_second_owner_is_refused_until_the_first_dies(tmp_path: Path) -> None:
    holder = _hold(tmp_path)
    try:
        with pytest.raises(DirectoryBusy, match=rf"{tmp_path} is in use by t1-trainer \(pid {holder.pid} on "):
            DirLock(tmp_path, "t1-trainer").acquire()
        threading.Timer(0.5, _kill9, (holder,)).start()  # an owner that is shutting down
        t0 = time.monotonic()
        with DirLock(tmp_path, "t1-trainer").acquire(wait_s=20):
            assert 0.4 < time.monotonic() - t0 < 10
    finally:
        if holder.poll() is None:
            _kill9(holder)
    with DirLock(tmp_path, "t1-trainer"):  # kill -9 leaves no stale lock behind
        pass


def _config(tmp_path: Path, model_dir: Path) -> Path:
    cfg = {"metrics": {"port": None}, "rollout": {"policy": "oracle_script"},
           "inference": {"model": {"path": str(model_dir)}},
           "trainer": {"work_dir": str(tmp_path / "work"), "policy_path": str(model_dir), "lock_wait_s": 1.0},
           "coordinator": {"run_dir": str(tmp_path / "run"), "train": False, "server": {"port": 0}}}
    path = tmp_path / "t1.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize(("module", "directory"), [("t1.cli.coordinator", "run"), ("t1.cli.trainer", "work")])
def test_a_second_service_on_a_directory_exits_3_naming_the_owner(tmp_path: Path, tiny_model_dir: Path,
                                                                 module: str, directory: str) -> None:
    config = _config(tmp_path, tiny_model_dir)
    holder = _hold(tmp_path / directory)
    try:
        proc = subprocess.run([sys.executable, "-m", module, "--config", str(config), "--set", "trainer.server.port=0"],
                              capture_output=True, text=True, timeout=180,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        _kill9(holder)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert f"{tmp_path / directory} is in use by t1-trainer (pid {holder.pid}" in proc.stderr
    assert "Traceback" not in proc.stderr


_PARENT = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from t1.coordinator.local.children import Child

    async def main():
        child = Child("svc", [sys.executable, "-c",
                              "print('svc listening on 127.0.0.1:1', flush=True); import time; time.sleep(600)"],
                      Path(sys.argv[1]))
        await child.start(60)
        print(child.pid, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[-1].startswith("Z"))


def test_a_child_service_dies_with_its_killed_parent(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path / "svc.log")], stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    assert _alive(child_pid)
    cmdline = Path(f"/proc/{child_pid}/cmdline").read_bytes()
    assert b"time.sleep(600)" in cmdline and b"lifeline" not in cmdline, "the lifeline became the service"
    _kill9(parent)
    deadline = time.monotonic() + 10
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child_pid), "the child outlived its parent"


def test_a_started_provider_sweeps_trees_only_when_no_one_else_uses_the_root(tmp_path: Path) -> None:
    root = tmp_path / "sandboxes"
    for name in ("sb-dead1", "sb-dead2"):
        (root / name / "app").mkdir(parents=True)
    (root / "not-a-tree").mkdir()
    live = _hold(root, "s")  # another run's provider is using this root
    try:
        other = SharedDirLock(root)
        assert not other.acquire(lambda: sweep_trees(root))
        assert (root / "sb-dead1").is_dir(), "trees of a live run are never swept"
        other.release()
    finally:
        _kill9(live)
    lock = SharedDirLock(root)
    assert lock.acquire(lambda: sweep_trees(root))
    assert sorted(p.name for p in root.iterdir()) == [".lock", "not-a-tree"]
    lock.release()
