"""The episode journal: frames on disk as turns complete, read back in order, torn tails, write failures."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from t1.coordinator.spool.journal import Journal, read_events


async def test_frames_are_read_back_in_order_and_a_torn_tail_is_cut(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "j", fsync_window_s=0.01)
    try:
        ep = journal.episode("task/a-1")  # an id with a slash still names one file in the directory
        assert ep.path.parent == tmp_path / "j"
        ep.begin(task_id="task/a")
        for i in range(50):
            ep.turn(turn=i, commands=[["ls", 0]], ids=np.arange(i, dtype=np.int32))
        await ep.written()
        events = ep.read()
        assert [k for k, _ in events] == ["begin"] + ["turn"] * 50
        assert events[0][1]["episode_id"] == "task/a-1"
        assert [f["turn"] for _, f in events[1:]] == list(range(50))
        assert np.array_equal(events[-1][1]["ids"], np.arange(49))
        for _ in range(500):  # a sync of the file system may take a while on a busy disk
            if journal.syncs:
                break
            await asyncio.sleep(0.01)
        assert journal.syncs >= 1 and journal.frames == 51
        # A crash in the middle of a write leaves a partial frame: reading stops before it.
        with ep.path.open("ab") as f:
            f.write(b"\x40\x00\x00\x00\x01\x02\x03\x04partial")
        intact, torn = read_events(ep.path)
        assert len(intact) == 51 and torn == 15
        with pytest.raises(ValueError, match="after the last intact record"):
            ep.read()
        ep.release()
        await journal.written(journal.submit(ep.path, None))
        assert not ep.path.exists() and journal.files() == []
    finally:
        journal.close()


async def test_a_failing_write_is_retried_and_nothing_is_lost_or_reordered(tmp_path: Path) -> None:
    """While writes fail the frames wait in memory, up to the backlog bound: past it, room() holds episodes back."""
    journal = Journal.open(tmp_path / "j", fsync_window_s=0, max_backlog_bytes=20_000)
    try:
        ep = journal.episode("e")
        ep.turn(turn=0)
        await ep.written()
        shutil.rmtree(tmp_path / "j")  # the directory is gone: every write fails until it is back
        for i in range(1, 4):
            ep.turn(turn=i, ids=np.zeros(2000, np.int32))  # 8 KB each: the third passes the bound
        room = asyncio.create_task(journal.room())
        await asyncio.sleep(0.3)
        assert not room.done()
        for _ in range(100):
            if journal.write_error:
                break
            await asyncio.sleep(0.01)
        assert "No such file" in journal.write_error and journal.write_errors >= 1
        (tmp_path / "j").mkdir()
        await asyncio.wait_for(room, 10)
        await asyncio.wait_for(ep.written(), 10)
        assert journal.write_error == ""
        assert [f["turn"] for _, f in ep.read()] == [1, 2, 3]  # turn 0 went with the directory
    finally:
        journal.close()


async def test_a_batch_is_written_file_by_file_in_order_with_one_write_per_file(tmp_path: Path, monkeypatch) -> None:
    """Frames of many episodes queued together: each file gets its own frames in order with one open and one write;
    a release queued between an episode's frames removes the file after the frames before it, and the frames after
    it start the file again."""
    journal = Journal.open(tmp_path / "j", fsync_window_s=0)
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, flags, *args):
        opened.append(os.fspath(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr("t1.coordinator.spool.journal.os.open", counting_open)
    try:
        eps = [journal.episode(f"e{i}") for i in range(20)]
        for turn in range(3):  # no await in between: the writer finds them queued together (one or a few batches)
            for ep in eps:
                ep.turn(turn=turn, ids=np.full(100, turn, np.int32))
        eps[0].release()
        eps[0].turn(turn=7)
        await journal.drained()
        for ep in eps[1:]:
            assert [f["turn"] for _, f in ep.read()] == [0, 1, 2]
            assert np.array_equal(ep.read()[2][1]["ids"], np.full(100, 2, np.int32))
        assert [f["turn"] for _, f in eps[0].read()] == [7]
        assert journal.frames == 61
        assert len(opened) < 61 and all(opened.count(str(ep.path)) <= 3 for ep in eps[1:])
    finally:
        journal.close()


async def test_closing_while_writes_fail_does_not_hang(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "j", fsync_window_s=0.01)
    ep = journal.episode("e")
    shutil.rmtree(tmp_path / "j")
    for i in range(5):
        ep.turn(turn=i)
    await asyncio.sleep(0.1)
    await asyncio.wait_for(asyncio.to_thread(journal.close), 15)  # each frame gets one more try, then is dropped
    assert journal.write_errors >= 1


async def test_the_end_of_training_discards_training_journals_only(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "j", fsync_window_s=0)
    try:
        for name, training in (("t1", True), ("t2", True), ("eval", False)):
            journal.episode(name, training=training).begin(task_id="t")
        await journal.drained()
        assert await asyncio.to_thread(journal.discard_training) == 2
        await journal.drained()
        assert [p.name for p in journal.files()] == ["eval.journal"]
    finally:
        journal.close()
