"""Transcript buffering: turns may wait in the buffer, explaining events and the end reach the file at once."""

from __future__ import annotations

from pathlib import Path

from t1.agent import transcript as tmod
from t1.agent.transcript import Transcript


def test_turns_are_buffered_and_notes_flush(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tmod, "FLUSH_EVERY_S", 3600.0)
    tx = Transcript(tmp_path, "org/task", "ep")
    assert tx.path == tmp_path / "org__task" / "ep.md"
    tx.header("org/task", "ep", "tool_calls", "Do the thing.", 12)
    assert "Do the thing." in tx.path.read_text(), "the header is written at once"
    tx.turn(0, "let me look", 5, 40, 1, "stop")
    tx.command("ls -la\nsecond line", "a\nb\n", 0, 0.25, False)
    assert "let me look" not in tx.path.read_text(), "a turn waits in the buffer"
    tx.note("bad reply: no tool call")
    text = tx.path.read_text()
    assert "let me look" in text and "### $ ls -la\n" in text and "> bad reply: no tool call" in text
    tx.turn(1, "done now", 3, 50, 1, "stop")
    tx.close()
    tx.close()  # closing twice is harmless
    assert tx.path.read_text().endswith("````\ndone now\n````\n\n")
    tx.note("after close is a no-op")
    assert "after close" not in tx.path.read_text()


def test_turns_reach_the_file_within_the_flush_interval(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tmod, "FLUSH_EVERY_S", 0.0)
    tx = Transcript(tmp_path, "t", "ep")
    tx.turn(0, "visible to tail -f", 5, 40, 1, "stop")
    assert tx.path is not None and "visible to tail -f" in tx.path.read_text()
    tx.close()


def test_no_directory_writes_nothing(tmp_path: Path) -> None:
    tx = Transcript(None, "t", "ep")
    tx.header("t", "ep", "tool_calls", "x", 1)
    tx.turn(0, "r", 1, 1, 0, "stop")
    tx.close()
    assert tx.path is None and not any(tmp_path.iterdir())


def test_a_live_transcript_holds_no_descriptor(tmp_path: Path) -> None:
    """10,000 live episodes ran a coordinator into its open-files limit with a descriptor each: none is held."""
    import os

    before = len(os.listdir("/proc/self/fd"))
    live = [Transcript(tmp_path, "task", f"ep-{i}") for i in range(200)]
    for i, tx in enumerate(live):
        tx.header("task", f"ep-{i}", "tool_calls", "do it", 10)
        tx.turn(1, "ls", 2, 12, 0, "stop")
    assert len(os.listdir("/proc/self/fd")) == before
    for tx in live:
        tx.close()
    text = (tmp_path / "task" / "ep-7.md").read_text()
    assert text.startswith("# Episode ep-7") and "## Turn 1" in text
