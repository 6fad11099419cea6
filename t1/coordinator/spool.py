"""The experience spool: an append-only, bounded, crash-safe queue of trajectories for the trainer.

Every finished trajectory is appended (and fsynced) here before anyone tries to send it;
senders read it through cursors and acknowledge by id. Whatever was appended and not
acknowledged is sent again after a restart of either side, so with the trainer's
idempotence by id each trajectory is trained exactly once. Segment files whose records
are all acknowledged are deleted.

Back-pressure: when the unacknowledged bytes reach `max_bytes`, `has_room` turns false and
`wait_for_room()` blocks until acks free space; the scheduler awaits it before admitting
new episodes (episodes already running still append: a finished episode is never dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from pathlib import Path

from t1.coordinator import spool_files as sf
from t1.coordinator.spool_files import Record
from t1.metrics import registry as m

log = logging.getLogger(__name__)


class Spool:
    """Open with `Spool.open(dir, ...)`; one process owns a spool directory at a time."""

    def __init__(self, directory: Path, max_bytes: int, segment_bytes: int, fsync: bool = True) -> None:
        if max_bytes <= 0 or segment_bytes <= 0:
            raise ValueError(f"spool sizes must be positive (max_bytes={max_bytes}, segment_bytes={segment_bytes})")
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self._pending: OrderedDict[int, Record] = OrderedDict()  # seq -> record, append order
        self._seq_of: dict[str, int] = {}
        self._seg_live: dict[int, int] = {}  # segment -> unacked records in it
        self._seg_acked: dict[int, set[str]] = {}
        self._pending_bytes = 0
        self._next_seq = 0
        self._active = 0
        self._active_size = 0
        self._write_lock = asyncio.Lock()
        self._room = asyncio.Event()
        self._cursors: set[asyncio.Queue[int]] = set()
        self._blocked_since: float | None = None
        self._ack_fd: int | None = None
        self.closed = False

    @classmethod
    def open(cls, directory: Path, max_bytes: int, segment_bytes: int, fsync: bool = True) -> Spool:
        """Load every unacknowledged record left by earlier runs (torn tails are cut off)."""
        directory.mkdir(parents=True, exist_ok=True)
        spool = cls(directory, max_bytes, segment_bytes, fsync)
        spool._load()
        return spool

    def _load(self) -> None:
        acked = sf.load_acks(self.directory)
        kept_acks: set[str] = set()
        segments = sf.list_segments(self.directory)
        for index in segments:
            live = 0
            self._seg_acked[index] = set()
            for rec in sf.load_segment(self.directory, index):
                if rec.trajectory_id in acked:
                    self._seg_acked[index].add(rec.trajectory_id)
                    kept_acks.add(rec.trajectory_id)
                elif rec.trajectory_id not in self._seq_of:
                    self._add_pending(rec)
                    live += 1
            self._seg_live[index] = live
        for index in segments:
            if self._seg_live[index] == 0:
                self._drop_segment(index, rewrite=False)
        sf.rewrite_acks(self.directory, {t for s in self._seg_acked.values() for t in s} & kept_acks)
        self._active = (segments[-1] + 1) if segments else 1
        self._ack_fd = os.open(self.directory / sf.ACK_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._update_room()
        log.info("spool %s: %d pending trajectories (%d bytes) from earlier runs",
                 self.directory, len(self._pending), self._pending_bytes)

    # -- state -------------------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    @property
    def has_room(self) -> bool:
        return self._pending_bytes < self.max_bytes

    def is_pending(self, trajectory_id: str) -> bool:
        return trajectory_id in self._seq_of

    def record_of(self, trajectory_id: str) -> Record | None:
        seq = self._seq_of.get(trajectory_id)
        return None if seq is None else self._pending[seq]

    async def wait_for_room(self) -> None:
        """Block until the unacknowledged bytes are below the bound (the back-pressure signal)."""
        while not self.has_room:
            await self._room.wait()

    def _add_pending(self, rec: Record) -> int:
        seq = self._next_seq
        self._next_seq += 1
        self._pending[seq] = rec
        self._seq_of[rec.trajectory_id] = seq
        self._pending_bytes += rec.size
        return seq

    def _update_room(self) -> None:
        m.SPOOL_PENDING_BYTES.set(self._pending_bytes)
        m.SPOOL_PENDING.set(len(self._pending))
        if self.has_room:
            if self._blocked_since is not None:
                m.SPOOL_BLOCKED_SECONDS.inc(time.monotonic() - self._blocked_since)
                self._blocked_since = None
            m.SPOOL_BLOCKED.set(0)
            self._room.set()
        else:
            if self._blocked_since is None:
                self._blocked_since = time.monotonic()
                log.warning("spool full (%d bytes unacknowledged, bound %d): holding back new episodes",
                            self._pending_bytes, self.max_bytes)
            m.SPOOL_BLOCKED.set(1)
            self._room.clear()

    # -- writing -----------------------------------------------------------------------------

    async def append(self, trajectory_id: str, payload: bytes) -> bool:
        """Durably append one trajectory; False if that id is already pending (not written twice)."""
        if self.closed:
            raise RuntimeError("spool is closed")
        if not trajectory_id:
            raise ValueError("trajectory_id must not be empty")
        async with self._write_lock:
            if trajectory_id in self._seq_of:
                return False
            head = sf.record_head(trajectory_id, len(payload))
            size = sf.record_frame_size(head, len(payload))
            if self._active_size and self._active_size + size > self.segment_bytes:
                self._active += 1
                self._active_size = 0
            index = self._active
            # The frame's CRC, write and fsync run on a thread: the loop never touches the payload's bytes.
            await asyncio.to_thread(self._write, sf.segment_path(self.directory, index), head, payload)
            self._active_size += size
            self._seg_live[index] = self._seg_live.get(index, 0) + 1
            self._seg_acked.setdefault(index, set())
            seq = self._add_pending(Record(trajectory_id, payload, index))
        m.SPOOL_APPENDED.inc()
        m.SPOOL_APPENDED_BYTES.inc(len(payload))
        self._update_room()
        for q in self._cursors:
            q.put_nowait(seq)
        return True

    def _write(self, path: Path, head: bytes, payload: bytes) -> None:
        with path.open("ab") as f:
            sf.write_record(f, head, payload)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())

    # -- acknowledging -------------------------------------------------------------------------

    def ack(self, trajectory_id: str) -> bool:
        """Mark one trajectory delivered; False if it was not pending (a duplicate ack)."""
        seq = self._seq_of.pop(trajectory_id, None)
        if seq is None:
            return False
        rec = self._pending.pop(seq)
        self._pending_bytes -= rec.size
        if self._ack_fd is not None:
            os.write(self._ack_fd, sf.encode_frame(trajectory_id.encode("utf-8")))
        self._seg_acked[rec.segment].add(trajectory_id)
        self._seg_live[rec.segment] -= 1
        if self._seg_live[rec.segment] == 0 and rec.segment != self._active:
            self._drop_segment(rec.segment, rewrite=True)
        m.SPOOL_ACKED.inc()
        self._update_room()
        return True

    def _drop_segment(self, index: int, rewrite: bool) -> None:
        with contextlib.suppress(FileNotFoundError):
            sf.segment_path(self.directory, index).unlink()
        self._seg_live.pop(index, None)
        self._seg_acked.pop(index, None)
        if rewrite:
            self._compact_acks()

    def _compact_acks(self) -> None:
        if self._ack_fd is not None:
            os.close(self._ack_fd)
        sf.rewrite_acks(self.directory, {t for s in self._seg_acked.values() for t in s})
        self._ack_fd = os.open(self.directory / sf.ACK_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    # -- reading -------------------------------------------------------------------------------

    def cursor(self) -> SpoolCursor:
        """A reader that yields every pending record once, in append order, then new appends."""
        q: asyncio.Queue[int] = asyncio.Queue()
        for seq in self._pending:
            q.put_nowait(seq)
        self._cursors.add(q)
        return SpoolCursor(self, q)

    def _record(self, seq: int) -> Record | None:
        return self._pending.get(seq)

    def _release(self, q: asyncio.Queue[int]) -> None:
        self._cursors.discard(q)

    def close(self) -> None:
        """Flush the ack log; pending records stay on disk for the next run."""
        if self.closed:
            return
        self.closed = True
        if self._ack_fd is not None:
            os.fsync(self._ack_fd)
            os.close(self._ack_fd)
            self._ack_fd = None
        if self._blocked_since is not None:
            m.SPOOL_BLOCKED_SECONDS.inc(time.monotonic() - self._blocked_since)
            self._blocked_since = None


class SpoolCursor:
    """One sender's view of the spool: `await next()` skips records acknowledged meanwhile."""

    def __init__(self, spool: Spool, queue: asyncio.Queue[int]) -> None:
        self._spool = spool
        self._queue = queue

    async def next(self) -> Record:
        while True:
            seq = await self._queue.get()
            rec = self._spool._record(seq)
            if rec is not None:
                return rec

    def next_nowait(self) -> Record | None:
        while not self._queue.empty():
            rec = self._spool._record(self._queue.get_nowait())
            if rec is not None:
                return rec
        return None

    def close(self) -> None:
        self._spool._release(self._queue)

    def __enter__(self) -> SpoolCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
