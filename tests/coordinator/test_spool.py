"""The spool: durability across kill -9, torn tails, rotation, ack compaction and back-pressure."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from t1.coordinator.spool import spool_recovery as sr
from t1.coordinator.spool.trajectory_spool import Spool
from t1.metrics import registry as m
from t1.trajectory import spool_files as sf


def _payload(i: int, size: int = 100) -> bytes:
    return bytes([i % 251]) * size


async def test_append_ack_reopen_keeps_only_unacked(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path, max_bytes=1 << 20, segment_bytes=350)
    for i in range(10):
        assert await spool.append(f"t{i}", _payload(i))
    assert not await spool.append("t3", _payload(3)), "a pending id is not written twice"
    assert len(sf.list_segments(tmp_path)) >= 3, "segments rotate at segment_bytes"
    for i in range(0, 10, 2):
        assert spool.ack(f"t{i}")
    assert not spool.ack("t0"), "second ack of the same id is a no-op"
    spool.close()

    again = Spool.open(tmp_path, max_bytes=1 << 20, segment_bytes=350)
    with again.cursor() as cur:
        got = []
        while (rec := cur.next_nowait()) is not None:
            got.append((rec.trajectory_id, rec.payload))
    assert got == [(f"t{i}", _payload(i)) for i in range(1, 10, 2)]
    assert again.pending_bytes == 5 * 100
    for i in range(1, 10, 2):
        again.ack(f"t{i}")
    again.close()
    # Every fully acknowledged segment except the active one is gone, and so are their acks.
    third = Spool.open(tmp_path, max_bytes=1 << 20, segment_bytes=350)
    assert third.pending_count == 0
    assert len(sf.list_segments(tmp_path)) <= 1
    assert len(sr.load_acks(tmp_path)) <= 3
    third.close()


async def test_torn_tail_is_cut_and_later_appends_survive(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    await spool.append("a", b"x" * 50)
    await spool.append("b", b"y" * 50)
    spool.close()
    seg = sf.segment_path(tmp_path, sf.list_segments(tmp_path)[-1])
    whole = seg.read_bytes()
    seg.write_bytes(whole + sf.encode_record("c", b"z" * 50)[:-7])  # a crash mid-write
    again = Spool.open(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    assert seg.read_bytes() == whole, "the torn frame is cut away"
    assert seg.with_name(seg.name + ".corrupt").read_bytes().startswith(whole), "its bytes are kept aside"
    await again.append("d", b"w" * 5)
    again.close()
    final = Spool.open(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20)
    with final.cursor() as cur:
        ids = [r.trajectory_id for r in iter(cur.next_nowait, None)]
    assert ids == ["a", "b", "d"]
    final.close()


_WRITER = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from t1.coordinator.spool.trajectory_spool import Spool

    async def main():
        spool = Spool.open(Path(sys.argv[1]), max_bytes=1 << 30, segment_bytes=4096)
        i = 0
        while True:
            tid = f"traj-{i}"
            await spool.append(tid, tid.encode() * 20)
            if i % 3 == 0:
                spool.ack(f"traj-{i}")
            print(tid, flush=True)
            i += 1

    asyncio.run(main())
""")


def test_kill_9_loses_no_appended_record(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    confirmed = []
    for line in proc.stdout:
        confirmed.append(line.strip())
        if len(confirmed) >= 300:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    confirmed += [line.strip() for line in proc.stdout if line.strip()]

    spool = Spool.open(tmp_path, max_bytes=1 << 30, segment_bytes=4096)
    with spool.cursor() as cur:
        pending = [r.trajectory_id for r in iter(cur.next_nowait, None)]
    expected_pending = [t for t in confirmed if int(t.split("-")[1]) % 3 != 0]
    # Everything confirmed and not acknowledged is there, in order, with its exact bytes.
    assert pending[: len(expected_pending)] == expected_pending
    # At most the one record whose append returned just before the kill, before it was printed.
    assert len(pending) <= len(expected_pending) + 1
    assert len(set(pending)) == len(pending)
    spool.close()


async def test_backpressure_blocks_admission_until_acks(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path, max_bytes=250, segment_bytes=1 << 20, fsync=False)
    await spool.append("a", b"1" * 100)
    await spool.append("b", b"2" * 100)
    assert spool.has_room
    await spool.append("c", b"3" * 100)  # appends never block: a finished episode is never dropped
    assert not spool.has_room
    assert m.REGISTRY.get_sample_value("t1_spool_backpressure") == 1
    waiter = asyncio.create_task(spool.wait_for_room())
    await asyncio.sleep(0.05)
    assert not waiter.done()
    spool.ack("a")
    await asyncio.wait_for(waiter, 1)
    assert m.REGISTRY.get_sample_value("t1_spool_backpressure") == 0
    assert m.REGISTRY.get_sample_value("t1_spool_backpressure_seconds_total") > 0
    spool.close()


async def test_cursor_sees_new_appends_and_skips_acked(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path, max_bytes=1 << 20, segment_bytes=1 << 20, fsync=False)
    await spool.append("a", b"1")
    await spool.append("b", b"2")
    cur = spool.cursor()
    spool.ack("a")
    assert (await cur.next()).trajectory_id == "b"
    nxt = asyncio.create_task(cur.next())
    await asyncio.sleep(0.01)
    assert not nxt.done()
    await spool.append("c", b"3")
    assert (await asyncio.wait_for(nxt, 1)).trajectory_id == "c"
    cur.close()
    spool.close()


def test_bad_sizes_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes=0"):
        Spool.open(tmp_path, max_bytes=0, segment_bytes=10)


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65535, 65536, 3 << 20])
@pytest.mark.parametrize("tid", ["a", "g-" + "x" * 40 + "-a3", "tâche/épisode-1"])
def test_record_written_in_pieces_is_byte_identical(tmp_path: Path, size: int, tid: str) -> None:
    """The spool writes head and payload apart (no copy of a 30 MB payload): the frame is encode_record's."""
    payload = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    head = sf.record_head(tid, len(payload))
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        sf.write_record(fd, head, payload)
    finally:
        os.close(fd)
    assert path.read_bytes() == sf.encode_record(tid, payload)
    assert sf.record_frame_size(head, len(payload)) == path.stat().st_size
    scan = sr.scan_segment(path)
    assert not scan.damage and sf.decode_record(scan.frames[0][1], path) == (tid, payload)


async def test_large_appends_read_back_after_reopen(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path, max_bytes=1 << 30, segment_bytes=5 << 20)
    payloads = {f"t{i}": bytes([i]) * ((2 << 20) + i) for i in range(4)}
    assert all(await asyncio.gather(*(spool.append(t, p) for t, p in payloads.items())))
    spool.close()
    again = Spool.open(tmp_path, max_bytes=1 << 30, segment_bytes=5 << 20)
    with again.cursor() as cur:
        got = {}
        while (rec := cur.next_nowait()) is not None:
            got[rec.trajectory_id] = rec.payload
    assert got == payloads and len(sf.list_segments(tmp_path)) == 2
    again.close()
