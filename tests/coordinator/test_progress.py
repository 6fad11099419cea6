"""The console progress view: live bars on a terminal (with log records printed above them), plain lines otherwise:
stage changes, trainer step of N, episodes, solve rate so far and an ETA."""

from __future__ import annotations

import asyncio
import io
import logging
import sys

import pytest
from rich.console import Console

from t1.coordinator.run.progress import EvalProgress, ProgressView, eta_s, format_eta, progress_line
from t1.rpc.loop import cancel_and_wait
from t1.v1 import coordinator_pb2 as pb


def _status() -> pb.RunStatus:
    return pb.RunStatus(stage="training", trainer_step=2, policy_version=2, finished_episodes=7, active_episodes=3,
                        turns_per_second=1.5, spool_pending=4)


def test_progress_line_names_stage_step_episodes_solve_rate_and_eta() -> None:
    line = progress_line(_status(), 5, {"episodes": 8, "resolved": 2}, None, 125.0)
    assert line == "training: trainer step 2/5, 7 episodes (3 running), training solve rate 0.25 of 8, ETA 2m05s"
    ev = progress_line(_status(), 5, {}, EvalProgress("eval rl", 40, 200, 10, 38), None)
    assert ev == "training: eval rl 40/200 attempts, solve rate 0.26 of 38 so far, ETA -"
    assert "solve rate -" in progress_line(_status(), 5, {}, None, None)


def test_eta_is_the_pace_so_far() -> None:
    assert eta_s(2, 8, 60.0) == 180.0 and eta_s(0, 8, 60.0) is None and eta_s(8, 8, 60.0) == 0.0
    assert format_eta(3725.0) == "ETA 1h02m" and format_eta(59.6) == "ETA 1m00s"


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


async def test_not_a_terminal_prints_plain_stage_and_progress_lines(caplog: pytest.LogCaptureFixture) -> None:
    console = Console(file=io.StringIO(), force_terminal=False)
    stage = ["warm-start-demos"]
    ev: list[EvalProgress | None] = [None]

    def status() -> pb.RunStatus:
        st = _status()
        st.stage = stage[0]
        return st

    plan = [1212]  # SFT's cap in the plan until SFT ends early, then the steps it took
    view = ProgressView(
        status,
        lambda: ev[0],
        total_steps=lambda: plan[0],
        training=lambda: {"episodes": 4, "resolved": 1},
        every_s=0.02,
        line_every_s=0.05,
        console=console,
    )
    with caplog.at_level(logging.INFO, logger="t1.console"):
        task = asyncio.create_task(view.run())
        await asyncio.sleep(0.15)
        plan[0] = 5
        await asyncio.sleep(0.15)
        stage[0], ev[0] = "eval-after", EvalProgress("eval rl", 3, 10, 1, 3)
        await asyncio.sleep(0.15)
        await cancel_and_wait(task)
    lines = [r.getMessage() for r in caplog.records if r.name == "t1.console"]
    assert lines[0] == "t1: stage warm-start-demos"
    assert "t1: stage eval-after (eval rl, 10 attempts)" in lines
    assert any(line.startswith("t1: warm-start-demos: trainer step 2/1212, 7 episodes") for line in lines)
    assert any(line.startswith("t1: warm-start-demos: trainer step 2/5, 7 episodes") and
               "training solve rate 0.25 of 4" in line for line in lines)
    assert any(line.startswith("t1: eval-after: eval rl 3/10 attempts, solve rate 0.33 of 3 so far") for line in lines)
    assert not any("\x1b" in line for line in lines) and console.file.getvalue() == "", "plain records, no bars"
