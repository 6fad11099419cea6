"""The experience spool: an append-only, bounded, crash-safe queue of trajectories for the trainer.

Every finished trajectory is appended (and fsynced) here before anyone tries to send it;
senders read it through cursors and acknowledge by id. Whatever was appended and not
acknowledged is sent again after a restart of either side, so with the trainer's
idempotence by id each trajectory is trained exactly once. Segment files whose records
are all acknowledged are deleted.

Back-pressure: when the unacknowledged bytes reach `max_bytes`, `has_room` turns false and
`wait_for_room()` blocks until acks free space; the scheduler awaits it before admitting
new episodes (episodes already running still append: a finished episode is never dropped).

A failing write (EACCES, ENOSPC, EIO, ...) does not raise: the record is held in memory (at
most `hold_bytes`; a further append waits for room there), `write_error` names the file and
the error, `has_room` turns false so no new episode starts, and a retry task writes the held
records in order once the disk takes them again. Held records are not durable and not sent
before they are written; a process killed during an outage loses them (docs/operations.md).
Recovery on open keeps every intact frame of a damaged file (t1/coordinator/spool/spool_recovery.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict, deque
from pathlib import Path

from t1.coordinator.spool import spool_recovery as sr
from t1.metrics import registry as m
from t1.trajectory import spool_files as sf
from t1.trajectory.spool_files import Record

log = logging.getLogger(__name__)
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 15.0


class Spool:
    """Open with `Spool.open(dir, ...)`; one process owns a spool directory at a time."""

    def __init__(self, directory: Path, max_bytes: int, segment_bytes: int, fsync: bool = True,
                 hold_bytes: int = 256 << 20) -> None:
        if max_bytes <= 0 or segment_bytes <= 0 or hold_bytes <= 0:
            raise ValueError(f"spool sizes must be positive (max_bytes={max_bytes}, segment_bytes={segment_bytes}, "
                             f"hold_bytes={hold_bytes})")
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.hold_bytes = hold_bytes
        self.write_error = ""  # set while writes fail: the file and the error
        self._held: deque[tuple[str, bytes]] = deque()
        self._held_ids: set[str] = set()
        self._held_bytes = 0
        self._hold_room = asyncio.Event()
        self._retry_task: asyncio.Task[None] | None = None
        self._retry_now = asyncio.Event()  # set when a removed segment freed disk space
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
    def open(cls, directory: Path, max_bytes: int, segment_bytes: int, fsync: bool = True,
             hold_bytes: int = 256 << 20) -> Spool:
        """Load every unacknowledged record left by earlier runs (damage is set aside and reported)."""
        directory.mkdir(parents=True, exist_ok=True)
        spool = cls(directory, max_bytes, segment_bytes, fsync, hold_bytes)
        spool._load()
        return spool

    def _load(self) -> None:
        sr.remove_leftovers(self.directory)
        acked = sr.load_acks(self.directory)
        kept_acks: set[str] = set()
        segments = sf.list_segments(self.directory)
        for index in segments:
            live = 0
            self._seg_acked[index] = set()
            for rec in sr.load_segment(self.directory, index):
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
        """Room for new episodes: below the byte bound, and writes succeed."""
        return self._pending_bytes < self.max_bytes and not self.write_error

    @property
    def held_count(self) -> int:
        return len(self._held)

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
        m.SPOOL_HELD.set(len(self._held))
        m.SPOOL_WRITE_FAILING.set(int(bool(self.write_error)))
        if self.has_room:
            if self._blocked_since is not None:
                m.SPOOL_BLOCKED_SECONDS.inc(time.monotonic() - self._blocked_since)
                self._blocked_since = None
            m.SPOOL_BLOCKED.set(0)
            self._room.set()
        else:
            if self._blocked_since is None:
                self._blocked_since = time.monotonic()
                if not self.write_error:
                    log.warning("spool full (%d bytes unacknowledged, bound %d): holding back new episodes",
                                self._pending_bytes, self.max_bytes)
            m.SPOOL_BLOCKED.set(1)
            self._room.clear()

    # -- writing -----------------------------------------------------------------------------

    async def append(self, trajectory_id: str, payload: bytes) -> bool:
        """Durably append one trajectory, or hold it while writes fail; False if that id is already taken."""
        if self.closed:
            raise RuntimeError("spool is closed")
        if not trajectory_id:
            raise ValueError("trajectory_id must not be empty")
        while True:
            async with self._write_lock:
                if trajectory_id in self._seq_of or trajectory_id in self._held_ids:
                    return False
                if not self.write_error:
                    try:
                        await self._write_one(trajectory_id, payload)
                        return True
                    except OSError as exc:
                        self._failing(exc)
                if not self._held or self._held_bytes + len(payload) <= self.hold_bytes:
                    self._hold(trajectory_id, payload)
                    return True
            self._hold_room.clear()
            await self._hold_room.wait()  # the memory bound: wait until the retry writes some out

    async def _write_one(self, trajectory_id: str, payload: bytes) -> None:
        """Write and fsync one frame (caller holds the write lock), then make it pending and visible."""
        head = sf.record_head(trajectory_id, len(payload))
        size = sf.record_frame_size(head, len(payload))
        if self._active_size and self._active_size + size > self.segment_bytes:
            self._roll()
        index = self._active
        path = sf.segment_path(self.directory, index)
        try:
            # The frame's CRC, write and fsync run on a thread: the loop never touches the payload's bytes.
            await asyncio.to_thread(sf.append_record, path, head, payload, self.fsync)
        except OSError as exc:
            # The partial frame was cut off (or, failing that, is a torn tail); later frames go to a new segment.
            self._roll()
            raise OSError(exc.errno, f"{path}: {exc.strerror or exc}") from exc
        self._active_size += size
        self._seg_live[index] = self._seg_live.get(index, 0) + 1
        self._seg_acked.setdefault(index, set())
        seq = self._add_pending(Record(trajectory_id, payload, index))
        m.SPOOL_APPENDED.inc()
        m.SPOOL_APPENDED_BYTES.inc(len(payload))
        self._update_room()
        for q in self._cursors:
            q.put_nowait(seq)

    def _roll(self) -> None:
        """Start a new active segment; the old one goes at once if acks emptied it while it was active.

        ack() drops a segment only once it is no longer active, so a trainer that keeps up (every
        record acknowledged while its segment is still written to) would otherwise leave each one on
        disk until the next open, and a full disk would never get back what its acks freed.
        """
        old = self._active
        self._active += 1
        self._active_size = 0
        if self._seg_live.get(old, 0) == 0:
            self._drop_segment(old, rewrite=bool(self._seg_acked.get(old)))

    def _failing(self, exc: OSError) -> None:
        m.SPOOL_WRITE_ERRORS.inc()
        if not self.write_error:
            log.error("spool write failed: %s; holding finished trajectories in memory (at most %d bytes), "
                      "admitting no new episodes, retrying", exc, self.hold_bytes)
        self.write_error = str(exc)
        self._update_room()
        if self._retry_task is None or self._retry_task.done():
            self._retry_task = asyncio.get_running_loop().create_task(self._retry(), name="spool-retry")

    def _hold(self, trajectory_id: str, payload: bytes) -> None:
        self._held.append((trajectory_id, payload))
        self._held_ids.add(trajectory_id)
        self._held_bytes += len(payload)
        self._update_room()

    async def _retry(self) -> None:
        """Write the held records, oldest first, with backoff, until all are durable."""
        delay = RETRY_FIRST_S
        while self._held or self.write_error:
            self._retry_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retry_now.wait(), delay)
            async with self._write_lock:
                try:
                    while self._held:
                        tid, payload = self._held[0]
                        await self._write_one(tid, payload)
                        self._held.popleft()
                        self._held_ids.discard(tid)
                        self._held_bytes -= len(payload)
                        self._hold_room.set()
                except OSError as exc:
                    self._failing(exc)
                    delay = min(delay * 2, RETRY_MAX_S)
                    continue
                log.warning("spool writes succeed again (%s cleared); admitting new episodes", self.write_error)
                self.write_error = ""
                self._update_room()
                self._hold_room.set()

    # -- acknowledging -------------------------------------------------------------------------

    def ack(self, trajectory_id: str) -> bool:
        """Mark one trajectory delivered; False if it was not pending (a duplicate ack)."""
        seq = self._seq_of.pop(trajectory_id, None)
        if seq is None:
            return False
        rec = self._pending.pop(seq)
        self._pending_bytes -= rec.size
        if self._ack_fd is not None:
            try:
                os.write(self._ack_fd, sf.encode_frame(trajectory_id.encode("utf-8")))
            except OSError as exc:  # a lost ack only makes the record a duplicate after a restart
                log.warning("spool ack log %s: %s (%s may be sent again after a restart)",
                            self.directory / sf.ACK_LOG, exc, trajectory_id)
        self._seg_acked[rec.segment].add(trajectory_id)
        self._seg_live[rec.segment] -= 1
        if self._seg_live[rec.segment] == 0 and rec.segment != self._active:
            self._drop_segment(rec.segment, rewrite=True)
        m.SPOOL_ACKED.inc()
        self._update_room()
        return True

    def _drop_segment(self, index: int, rewrite: bool) -> None:
        try:
            sf.segment_path(self.directory, index).unlink(missing_ok=True)
            self._retry_now.set()
        except OSError as exc:  # left on disk: its records are acked, the next open drops it
            log.warning("spool: cannot remove acknowledged segment: %s", exc)
        self._seg_live.pop(index, None)
        self._seg_acked.pop(index, None)
        if rewrite:
            self._compact_acks()

    def _compact_acks(self) -> None:
        try:
            sf.rewrite_acks(self.directory, {t for s in self._seg_acked.values() for t in s})
        except OSError as exc:  # the old, longer ack log stays valid
            log.warning("spool: cannot compact the ack log: %s", exc)
            return
        fd = os.open(self.directory / sf.ACK_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if self._ack_fd is not None:
            os.close(self._ack_fd)
        self._ack_fd = fd

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
        if self._retry_task is not None:
            self._retry_task.cancel()
        self._flush_held_on_close()
        if self._ack_fd is not None:
            os.fsync(self._ack_fd)
            os.close(self._ack_fd)
            self._ack_fd = None
        if self._blocked_since is not None:
            m.SPOOL_BLOCKED_SECONDS.inc(time.monotonic() - self._blocked_since)
            self._blocked_since = None


    def _flush_held_on_close(self) -> None:
        """A last try for held records (blocking: the loop is shutting down); what still fails is lost."""
        path = sf.segment_path(self.directory, self._active + 1)
        while self._held:
            tid, payload = self._held[0]
            try:
                sf.append_record(path, sf.record_head(tid, len(payload)), payload, self.fsync)
            except OSError as exc:
                log.error("spool closing with %d finished trajectories that could not be written (%s: %s): "
                          "they are lost", len(self._held), path, exc)
                return
            self._held.popleft()


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
