"""A local run supervises its children: kill -9 of a real inference server restarts it on its port (bounded),
kill -9 of the trainer ends the run with an error naming it, and a run that did not finish never says "done"."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from smoke_run import small_config
from smoke_run import start_coordinator as _start

from t1.config.loader import load_config
from t1.coordinator.local import local_stack as local_mod
from t1.coordinator.local.children import Child, ChildFailed
from t1.coordinator.local.local_stack import LocalStack
from t1.rpc.introspect import health_status

_SERVE = "import time; print('svc listening on 127.0.0.1:1', flush=True); time.sleep(600)"


async def _supervised_error(stack: LocalStack, timeout_s: float) -> str:
    with pytest.raises(ChildFailed) as err:
        await asyncio.wait_for(stack.supervise(), timeout_s)
    return str(err.value)


async def test_a_killed_inference_server_comes_back_on_its_port_then_the_run_fails_past_its_restarts(
        tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_mod, "MAX_RESTARTS", 1)
    cfg = load_config(None, [f"inference.model.path={tiny_model_dir}", "inference.pool.num_local_servers=1"])
    stack = LocalStack(cfg, None, [f"inference.model.path={tiny_model_dir}"], tmp_path / "run")
    try:
        [address] = await stack.inference_endpoints()
        child = stack.children[0]
        first_pid = child.pid
        assert first_pid is not None
        supervisor = asyncio.create_task(stack.supervise())
        os.kill(first_pid, signal.SIGKILL)
        deadline = time.monotonic() + 240
        while child.restarts == 0 or not child.address:
            assert not supervisor.done(), supervisor.exception()
            assert time.monotonic() < deadline, "the killed server was not restarted"
            await asyncio.sleep(0.2)
        assert child.address == address and child.pid != first_pid
        assert await asyncio.to_thread(health_status, address) == "SERVING"
        second_pid = child.pid
        assert second_pid is not None
        os.kill(second_pid, signal.SIGKILL)  # past MAX_RESTARTS: the run ends with an error naming it
        with pytest.raises(ChildFailed) as err:
            await asyncio.wait_for(supervisor, 30)
        assert f"inference-0 (pid {second_pid}) was killed by SIGKILL" in str(err.value)
        assert "restarted 1 times" in str(err.value) and "inference-0.log" in str(err.value)
    finally:
        await stack.stop(5)
    assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == psutil.STATUS_ZOMBIE


async def test_a_killed_trainer_is_named_and_not_restarted(tmp_path: Path) -> None:
    cfg = load_config(None, [])
    stack = LocalStack(cfg, None, [], tmp_path / "run")
    trainer = Child("trainer", [sys.executable, "-c", _SERVE, "--port", "0"], tmp_path / "run" / "logs" / "trainer.log")
    stack.children.append(trainer)
    try:
        await trainer.start(60)
        assert trainer.pid is not None
        pid = trainer.pid
        os.kill(pid, signal.SIGKILL)
        message = await _supervised_error(stack, 30)
        assert f"trainer (pid {pid}) was killed by SIGKILL" in message and "--resume" in message
        assert trainer.restarts == 0
    finally:
        await stack.stop(5)


async def test_children_stopped_by_the_stack_are_not_restarted(tmp_path: Path) -> None:
    stack = LocalStack(load_config(None, []), None, [], tmp_path / "run")
    child = Child("inference-0", [sys.executable, "-c", _SERVE, "--port", "0"], tmp_path / "inference-0.log")
    stack.children.append(child)
    await child.start(60)
    supervisor = asyncio.create_task(stack.supervise())
    await stack.stop(5)
    await asyncio.sleep(local_mod.SUPERVISE_EVERY_S * 3)
    assert not supervisor.done() and child.restarts == 0
    supervisor.cancel()


@pytest.fixture()
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="t1-child-death-"))
    path.chmod(0o711)  # sandbox users must traverse to their trees
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _child_pid(proc_pid: int, module: str) -> int:
    for p in psutil.Process(proc_pid).children(recursive=True):
        if module in " ".join(p.cmdline()):
            return p.pid
    raise AssertionError(f"no {module} child")


@pytest.mark.slow  # a full local stack: two to four minutes here
@pytest.mark.timeout(900)
def test_a_run_whose_trainer_is_killed_ends_with_an_error_naming_it(root: Path, tiny_model_dir: Path) -> None:
    cfg = small_config(root, tiny_model_dir, max_steps=50)
    cfg["coordinator"]["eval"]["before_training"] = False
    proc, out = _start(root, cfg)
    try:
        deadline = time.monotonic() + 480
        run_log = root / "run" / "run.jsonl"
        while not (run_log.is_file() and '"stage":"training"' in run_log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text(errors="replace")[-4000:]
            time.sleep(1)
        trainer = _child_pid(proc.pid, "t1.cli.trainer")
        inference = _child_pid(proc.pid, "t1.cli.inference")
        os.kill(trainer, signal.SIGKILL)
        rc = proc.wait(120)  # noticed within a second, then the usual stop
    finally:
        if proc.poll() is None:
            proc.kill()
    log = out.read_text(errors="replace")
    assert rc == 1, log[-4000:]
    assert f"trainer (pid {trainer}) was killed by SIGKILL" in log
    assert " done" not in log.splitlines()[-1]
    assert not psutil.pid_exists(inference) or psutil.Process(inference).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow  # a full local stack: two to four minutes here
@pytest.mark.timeout(900)
def test_a_run_whose_inference_server_is_killed_finishes(root: Path, tiny_model_dir: Path) -> None:
    cfg = small_config(root, tiny_model_dir, max_steps=2)
    cfg["coordinator"]["eval"]["before_training"] = False
    proc, out = _start(root, cfg)
    try:
        deadline = time.monotonic() + 480
        run_log = root / "run" / "run.jsonl"
        while not (run_log.is_file() and '"stage":"training"' in run_log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text(errors="replace")[-4000:]
            time.sleep(1)
        inference = _child_pid(proc.pid, "t1.cli.inference")
        os.kill(inference, signal.SIGKILL)
        rc = proc.wait(600)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = out.read_text(errors="replace")
    assert rc == 0, log[-4000:]
    detail = (root / "run" / "logs" / "coordinator.log").read_text(errors="replace")
    assert (f"inference-0 (pid {inference}) was killed by "
            "SIGKILL") in detail and "restarting it (restart 1 of 3)" in detail
    assert "inference-0 is serving again on" in detail
    assert log.rstrip().splitlines()[-1].startswith("t1: run local-small done")
