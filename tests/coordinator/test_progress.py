"""The console progress view: live bars on a terminal (with log records printed above them), log lines otherwise."""

from __future__ import annotations

import asyncio
import io
import logging
import sys

import pytest
from rich.console import Console

from t1.coordinator.progress import EvalProgress, ProgressView, status_line
from t1.rpc.loop import cancel_and_wait
from t1.v1 import coordinator_pb2 as pb


def _status() -> pb.RunStatus:
    return pb.RunStatus(stage="training", trainer_step=2, policy_version=2, finished_episodes=7, active_episodes=3,
                        turns_per_second=1.5, spool_pending=4)


def test_status_line_names_the_numbers() -> None:
    line = status_line(_status(), 5)
    assert "training" in line and "step 2/5" in line and "v2" in line and "7 done / 3 running" in line
    assert "spool 4" in line


async def test_terminal_shows_bars_and_logs_above_them() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=140)
    handler = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        view = ProgressView(_status, lambda: EvalProgress("eval after", 1, 3), total_steps=5, every_s=0.05,
                            console=console)
        task = asyncio.create_task(view.run())
        await asyncio.sleep(0.3)
        assert handler.stream is not sys.stderr, "log records go through the live console"
        logging.getLogger("t1.test").warning("a log record during progress")
        await asyncio.sleep(0.2)
        await cancel_and_wait(task)
    finally:
        root.removeHandler(handler)
    assert handler.stream is sys.stderr, "restored when the view stops"
    out = buf.getvalue()
    assert "trainer steps" in out and "2/5" in out and "eval after" in out and "1/3" in out
    assert "a log record during progress" in out


async def test_not_a_terminal_logs_progress_lines(caplog: pytest.LogCaptureFixture) -> None:
    console = Console(file=io.StringIO(), force_terminal=False)
    view = ProgressView(_status, lambda: None, total_steps=5, log_every_s=0.05, console=console)
    with caplog.at_level(logging.INFO, logger="t1.coordinator.progress"):
        task = asyncio.create_task(view.run())
        await asyncio.sleep(0.2)
        await cancel_and_wait(task)
    assert any("progress: training: trainer step 2/5" in r.getMessage() for r in caplog.records)
