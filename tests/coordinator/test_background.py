"""Background loops fail loudly: a loop that dies is reported and stops the run; closing never skips a part."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from t1.config.loader import load_config
from t1.coordinator.run import parts as parts_mod
from t1.coordinator.run.app import EXIT_FAILED, Coordinator
from t1.coordinator.run.parts import Background, BackgroundFailed, Parts

LOOPS = ("status-ticker", "progress", "trainer-link", "weight-sync", "trainer-status")


async def _forever() -> None:
    await asyncio.Event().wait()


async def _dies(after_s: float) -> None:
    await asyncio.sleep(after_s)
    raise ValueError("boom")


@pytest.mark.parametrize("dying", LOOPS)
async def test_a_dying_loop_is_reported_by_name_and_stop_ends_every_loop(dying: str) -> None:
    heard: list[BackgroundFailed] = []
    bg = Background(heard.append)
    tasks = {name: bg.spawn(_dies(0.01) if name == dying else _forever(), name) for name in LOOPS}
    await asyncio.wait({tasks[dying]})
    await asyncio.sleep(0)  # the done-callback runs
    assert [f.name for f in heard] == [dying] and isinstance(heard[0].error, ValueError)
    assert dying in str(heard[0]) and "boom" in str(heard[0])
    failures = await bg.stop()  # does not raise: the teardown after it must run
    assert [f.name for f in failures] == [dying]
    assert all(t.done() for t in tasks.values()) and bg.running == []


async def test_stop_collects_errors_of_loops_that_fail_while_cancelled() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise OSError("cleanup failed")

    bg = Background()
    first = bg.spawn(fails_on_cancel(), "first")
    second = bg.spawn(fails_on_cancel(), "second")
    third = bg.spawn(_forever(), "third")
    await asyncio.sleep(0)
    failures = await bg.stop()
    assert sorted(f.name for f in failures) == ["first", "second"]
    assert first.done() and second.done() and third.cancelled()


@pytest.fixture()
def sandbox_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="t1-background-test-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


async def test_close_goes_on_past_a_part_that_fails_to_close(tmp_path: Path, tiny_model_dir: Path,
                                                             sandbox_root: Path, monkeypatch) -> None:
    run_dir = tmp_path / "run"
    cfg = load_config(None, [f"inference.model.path={tiny_model_dir}", f"coordinator.run_dir={run_dir}",
                             "coordinator.server.port=0", "metrics.port=null", f"sandbox.local.root={sandbox_root}"])
    parts = await Parts.build(cfg, run_dir, [], parts_mod.RunState())
    await parts.start_services()
    parts.background.spawn(_dies(0.0), "trainer-status")
    closed: list[str] = []

    async def evals_close_fails() -> None:
        raise RuntimeError("eval store gone")

    real_router_close, real_sandboxes_close = parts.router.close, parts.sandboxes.close

    async def router_close() -> None:
        closed.append("router")
        await real_router_close()

    async def sandboxes_close(timeout_s: float) -> None:
        closed.append("sandboxes")
        await real_sandboxes_close(timeout_s)

    monkeypatch.setattr(parts.evals, "close", evals_close_fails)
    monkeypatch.setattr(parts.router, "close", router_close)
    monkeypatch.setattr(parts.sandboxes, "close", sandboxes_close)
    await asyncio.sleep(0.05)
    await parts.close(30.0)
    assert closed == ["router", "sandboxes"]
    assert parts.background.running == []
    assert [f.name for f in parts.background.failures] == ["trainer-status"]


@pytest.mark.parametrize("loop", ["status-ticker", "progress"])
async def test_a_coordinator_whose_loop_dies_ends_with_an_error_naming_it(
        tmp_path: Path, tiny_model_dir: Path, sandbox_root: Path, monkeypatch, capsys, loop: str) -> None:
    """An eval-only coordinator (it would serve until a signal): the loop's death ends it, exit 1, all closed."""
    async def dies(self) -> None:
        await asyncio.sleep(0.2)
        raise KeyError("status source gone")

    if loop == "status-ticker":
        monkeypatch.setattr(parts_mod.Parts, "_tick", dies)
    else:
        monkeypatch.setattr(parts_mod.ProgressView, "run", dies)
    cfg = load_config(None, [f"inference.model.path={tiny_model_dir}", f"coordinator.run_dir={tmp_path / 'run'}",
                             "coordinator.server.port=0", "metrics.port=null", f"sandbox.local.root={sandbox_root}",
                             "coordinator.train=false", "rollout.policy=oracle_script"])
    coordinator = Coordinator(cfg)
    before = {t for t in asyncio.all_tasks()}
    rc = await asyncio.wait_for(coordinator.run(), 60)
    assert rc == EXIT_FAILED
    assert isinstance(coordinator.failure, BackgroundFailed) and coordinator.failure.name == loop
    err = capsys.readouterr().err
    assert f"background loop {loop} failed: KeyError" in err
    assert coordinator.parts is not None and coordinator.parts.background.running == []
    left = {t for t in asyncio.all_tasks() if t not in before and not t.done()}
    assert left == set(), [t.get_name() for t in left]
