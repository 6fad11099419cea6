"""Issue 19 cases 4 and 5: a damaged spool file loses only the frames the damage touches (kept aside,
reported with file, byte ranges and count); a spool that cannot write holds finished trajectories,
stops admission, alerts, and writes them when the disk is back. `t1 spool check|repair` on real files."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from t1.cli.main import main as t1_main
from t1.coordinator.spool import spool_recovery as sr
from t1.coordinator.spool.trajectory_spool import Spool
from t1.metrics import registry as m
from t1.trajectory import spool_files as sf

N = 11


def _sample(name: str) -> float:
    return m.REGISTRY.get_sample_value(name) or 0.0


async def _segment_of(directory: Path, n: int = N) -> tuple[Path, list[int]]:
    """One segment of n records t0..t{n-1}; returns it and each frame's start offset."""
    spool = Spool.open(directory, max_bytes=1 << 30, segment_bytes=1 << 30)
    for i in range(n):
        await spool.append(f"t{i}", bytes([i]) * (200 + i))
    spool.close()
    [index] = sf.list_segments(directory)
    starts = [0]
    for i in range(n - 1):
        starts.append(starts[-1] + len(sf.encode_record(f"t{i}", bytes([i]) * (200 + i))))
    return sf.segment_path(directory, index), starts


def _pending(directory: Path) -> list[str]:
    spool = Spool.open(directory, max_bytes=1 << 30, segment_bytes=1 << 30)
    with spool.cursor() as cur:
        ids = [r.trajectory_id for r in iter(cur.next_nowait, None)]
    spool.close()
    return ids


def _damage(path: Path, offset: int, value: bytes) -> bytes:
    data = bytearray(path.read_bytes())
    original = bytes(data)
    data[offset : offset + len(value)] = value
    path.write_bytes(bytes(data))
    return original


@pytest.mark.parametrize(("where", "value", "lost"), [
    ("length of record 3", b"\x10\x00\x00\x00", ["t3"]),        # a damaged length field mid-file
    ("length of record 0", b"\xff\xff\xff\x7f", ["t0"]),        # a huge first length
    ("body of record 5", b"\x00\x00", ["t5"]),                  # a bad checksum mid-file
    ("body of record 10", b"\xee", ["t10"]),                    # a flipped byte in the last frame
    ("records 4 to 6", b"\xab" * 500, ["t4", "t5", "t6"]),      # a garbage block over three frames
])
async def test_damage_costs_only_the_frames_it_touches(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       where: str, value: bytes, lost: list[str]) -> None:
    seg, starts = await _segment_of(tmp_path)
    record = int(where.split()[-1]) if "records" not in where else 4
    offset = starts[record] + (0 if where.startswith("length") else 40)
    original = _damage(seg, offset, value)
    caplog.set_level(logging.WARNING, logger="t1.coordinator.spool.spool_recovery")
    damaged_before = _sample("t1_spool_damaged_ranges_total")
    assert _pending(tmp_path) == [f"t{i}" for i in range(N) if f"t{i}" not in lost]
    side = seg.with_name(seg.name + ".corrupt")
    assert side.read_bytes() == original[:offset] + value + original[offset + len(value):], "damage kept aside"
    [warning] = [r.getMessage() for r in caplog.records if "spool recovery" in r.getMessage()]
    assert str(seg) in warning and f"bytes {starts[record]}-" in warning and str(side) in warning
    assert "1 damaged ranges" in warning and f"{N - len(lost)} intact records kept" in warning
    assert _sample("t1_spool_damaged_ranges_total") == damaged_before + 1
    # The repaired file is clean: a second open finds nothing more to set aside.
    caplog.clear()
    assert _pending(tmp_path) == [f"t{i}" for i in range(N) if f"t{i}" not in lost]
    assert not [r for r in caplog.records if "spool recovery" in r.getMessage()]


async def test_a_damaged_ack_log_only_resends(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path, max_bytes=1 << 30, segment_bytes=1 << 30)
    for i in range(4):
        await spool.append(f"t{i}", b"x" * 50)
    spool.ack("t0")
    spool.ack("t1")
    spool.close()
    _damage(tmp_path / sf.ACK_LOG, 4, b"\x00")  # the first ack's checksum
    assert _pending(tmp_path) == ["t0", "t2", "t3"], "a lost ack makes its record a duplicate, never a loss"


def test_spool_check_and_repair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    seg, starts = asyncio.run(_segment_of(run_dir / "spool"))
    assert t1_main(["spool", "check", str(run_dir)]) == 0
    assert "0 damaged ranges" in capsys.readouterr().out
    _damage(seg, starts[3], b"\x10\x00\x00\x00")
    before = seg.read_bytes()
    assert t1_main(["spool", "check", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert f"damaged bytes {starts[3]}-{starts[4]}: checksum mismatch" in out
    assert f"{N - 1} unacknowledged records" in out and "t1 spool repair" in out
    assert seg.read_bytes() == before, "check changes nothing"
    assert t1_main(["spool", "repair", str(run_dir)]) == 0
    assert f"{N - 1} unacknowledged records kept" in capsys.readouterr().out
    assert seg.with_name(seg.name + ".corrupt").read_bytes() == before
    assert t1_main(["spool", "check", str(run_dir)]) == 0


async def test_unwritable_spool_holds_stops_admission_and_recovers(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    spool = Spool.open(directory, max_bytes=1 << 30, segment_bytes=1 << 30, hold_bytes=250)
    assert await spool.append("a", b"1" * 100)
    # The directory turns unwritable mid-run: every open under it fails with a real OS error.
    os.rename(directory, tmp_path / "away")
    directory.write_text("not a directory")
    assert spool.has_room
    assert await spool.append("b", b"2" * 100), "a finished trajectory is accepted into memory"
    assert not spool.has_room and str(directory) in spool.write_error
    assert _sample("t1_spool_write_failing") == 1 and spool.held_count == 1
    assert await spool.append("c", b"3" * 100)
    assert not await spool.append("b", b"2" * 100), "a held id is not taken twice"
    third = asyncio.create_task(spool.append("d", b"4" * 100))  # over hold_bytes: waits, never dropped
    await asyncio.sleep(1.2)
    assert not third.done() and spool.held_count == 2
    with spool.cursor() as cur:
        assert [r.trajectory_id for r in iter(cur.next_nowait, None)] == ["a"], "held records are not sent"
        directory.unlink()
        os.rename(tmp_path / "away", directory)  # the disk is back
        assert await asyncio.wait_for(third, 30)
        for _ in range(200):
            if spool.has_room and spool.held_count == 0:
                break
            await asyncio.sleep(0.05)
        assert spool.has_room and spool.write_error == "" and _sample("t1_spool_write_failing") == 0
        assert [r.trajectory_id for r in iter(cur.next_nowait, None)] == ["b", "c", "d"]
    spool.close()
    assert _pending(directory) == ["a", "b", "c", "d"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: four 16 KiB records do not fit."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.system(f"mount -t tmpfs -o size=64k tmpfs {mnt} 2>/dev/null") != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        os.system(f"umount {mnt}")


async def _drain(spool: Spool, expected: int) -> list[str]:
    """A trainer that sends and acknowledges everything, for up to 30 s; the ids in the order sent."""
    sent: list[str] = []
    with spool.cursor() as cur:
        for _ in range(600):
            while (rec := cur.next_nowait()) is not None:
                sent.append(rec.trajectory_id)
                spool.ack(rec.trajectory_id)
            if len(sent) == expected and spool.has_room:
                break
            await asyncio.sleep(0.05)
    return sent


async def test_a_full_disk_holds_and_recovers(small_disk: Path) -> None:
    spool = Spool.open(small_disk, max_bytes=1 << 30, segment_bytes=1 << 30)
    try:
        ids = [f"t{i}" for i in range(12)]
        for i, tid in enumerate(ids):  # 12 x 16 KiB > 64 KiB: ENOSPC partway
            assert await spool.append(tid, bytes([i]) * (16 << 10))
        assert "No space left" in spool.write_error and not spool.has_room and spool.held_count > 0
        sent = await _drain(spool, len(ids))  # acknowledged segments free the disk
        assert sent == ids and spool.held_count == 0 and spool.has_room and not spool.write_error
    finally:
        spool.close()


async def test_acks_while_a_segment_is_active_free_the_full_disk(small_disk: Path) -> None:
    """Every record of the segment being written is acknowledged, then the next write finds the disk full.

    That segment must go (it holds nothing unacknowledged) and the failed write must leave no partial
    frame behind: otherwise the space the acks freed is never given back and the held record waits
    forever. A trainer that keeps up acknowledges exactly like this.
    """
    spool = Spool.open(small_disk, max_bytes=1 << 30, segment_bytes=1 << 30)
    try:
        for i in range(3):
            assert await spool.append(f"t{i}", bytes([i]) * (16 << 10))
        assert await _drain(spool, 3) == ["t0", "t1", "t2"]
        assert await spool.append("t3", b"3" * (20 << 10))  # 3 x 16 KiB + 20 KiB > 64 KiB
        assert spool.held_count == 1 or not spool.write_error  # held, or written once the full segment went
        assert await _drain(spool, 1) == ["t3"] and spool.held_count == 0 and not spool.write_error
        segments = sf.list_segments(small_disk)
        assert len(segments) <= 1, f"acknowledged segments left on disk: {segments}"
    finally:
        spool.close()


async def test_a_trainer_that_keeps_up_leaves_one_segment(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path, max_bytes=1 << 30, segment_bytes=4096)
    for i in range(200):
        assert await spool.append(f"t{i}", b"x" * 1000)
        assert spool.ack(f"t{i}")
    assert len(sf.list_segments(tmp_path)) == 1, "segments whose records were all acknowledged are deleted"
    assert len(sr.load_acks(tmp_path)) <= 4, "the ack log keeps only acks of segments still on disk"
    spool.close()
    assert _pending(tmp_path) == []
