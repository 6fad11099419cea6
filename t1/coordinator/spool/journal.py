"""The episode journal: each live episode's turns on the coordinator's disk, not in its memory.

One file per live episode, `<run_dir>/journal/<quoted episode id>.journal`, a sequence of the
spool's frames (`u32 length | u32 crc32(body) | body`, t1/trajectory/spool_files.py) whose body is
msgpack `[kind, fields]`, arrays as the trajectory codec's ndarray extension. Kinds, in order:

    begin    who the episode is (task, group, attempt, agent format)
    sandbox  the sandbox it got (its provider's SandboxRecord: how a restarted coordinator reattaches it)
    ready    the sandbox is provisioned: how shells start (workdir, env, user), the verifier baseline
    segment  a TokenBuffer segment starts       } the buffer's own changes (t1/tito/buffer.BufferSink):
    gen      a generation with its arrays       } replayed at export into the trajectory
    ctx      an observation's ids and messages  } (t1/tito/replay.py), byte-identical
    turn     a turn ended: its index, commands with exit codes, a bad reply, a verifier checkpoint, the
             next observation, the shell's directory and exports when they changed, the buffer's counters
    resumed  a restarted coordinator continues the episode from its last turn (t1/agent/resume_point.py)

Writes run on one writer thread in submission order: the loop packs a frame body and queues it;
every WRITE_EVERY_S (at once when an export or the back-pressure waits) the thread takes what is
queued, checksums the frames and appends each file's in one write (open, write, close: no
descriptor held per episode; a turn's end and the next observation usually go together) and tells
waiting exports. One wake-up serves many turns: handing the GIL to the thread per frame cost about
1 ms of CPU a turn. A frame reaches the file, so the page cache, which survives a kill of the
coordinator, within WRITE_EVERY_S of its turn (a kill loses the turn in flight and at most that).
With `fsync_window_ms` the files reach the disk that often: one syncfs of the journal's file system
covers every episode written in the window (fsyncs per turn fall as episodes grow), so a crash of
the machine loses at most that window of turns;
without it (0), the kernel's writeback decides. A write
that fails (a full disk) is retried with backoff, its frames held in memory meanwhile, counted.
Back-pressure: while more than `max_backlog_bytes` wait to be written (a disk slower than the
turns, a failing disk), `room()` blocks, and episodes await it before their next turn: memory stays
bounded and the turn rate falls to what the disk takes. An episode's file is removed once its
trajectory is in the spool (`release`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import heapq
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from t1.metrics import registry as m
from t1.routing.block import RoutingBlock
from t1.tito.render import Message
from t1.trajectory import spool_files as sf
from t1.trajectory.serialization import CodecError, pack_parts, unpack_obj

log = logging.getLogger(__name__)
SUFFIX = ".journal"
WRITE_EVERY_S = 0.02
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 10.0
IOV_MAX = 1024  # Linux's most buffers in one writev
Event = tuple[str, dict[str, Any]]
Body = list[Any]  # a frame body as pack_parts gives it (bytes, flat byte memoryviews of arrays), written unjoined


def _syncfs() -> Any:
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).syncfs
    return None


_SYNCFS = _syncfs()


class Journal:
    """Open with `Journal.open(dir, fsync_window_s)`; one coordinator owns a journal directory at a time."""

    def __init__(self, directory: Path, fsync_window_s: float, max_backlog_bytes: int = 256 << 20) -> None:
        if fsync_window_s < 0:
            raise ValueError("fsync_window_s must be >= 0 (0: never synced, the page cache only), got "
                             f"{fsync_window_s}")
        if max_backlog_bytes <= 0:
            raise ValueError(f"max_backlog_bytes must be positive, got {max_backlog_bytes}")
        self.directory = directory
        self.fsync_window_s = fsync_window_s
        self.max_backlog_bytes = max_backlog_bytes
        self._backlog_bytes = 0  # queued, not yet written (changed under _cv)
        self._room_waiters: list[asyncio.Future[None]] = []
        self.frames = self.bytes = self.syncs = self.write_errors = 0  # written so far (read by the load bench)
        self.write_error = ""
        self._queue: deque[tuple[int, Path, Body | None, int]] = deque()  # seq, path, body (None: remove), bytes
        self._cv = threading.Condition()
        self._next_seq = 0
        self._written = -1
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._hurry = False  # someone waits for the writer: write now, not at the next WRITE_EVERY_S
        self._dirty: set[Path] = set()
        self._thread = threading.Thread(target=self._run, name="t1-journal", daemon=True)

    @classmethod
    def open(cls, directory: Path, fsync_window_s: float, max_backlog_bytes: int = 256 << 20) -> Journal:
        directory.mkdir(parents=True, exist_ok=True)
        journal = cls(directory, fsync_window_s, max_backlog_bytes)
        journal._thread.start()
        return journal

    def path_of(self, episode_id: str) -> Path:
        return self.directory / (quote(episode_id, safe="") + SUFFIX)

    def episode(self, episode_id: str, training: bool = True) -> EpisodeJournal:
        """A journal for one episode; a training episode's is spooled if a restart finds it unfinished."""
        return EpisodeJournal(self, episode_id, training)

    def files(self) -> list[Path]:
        """Journals on disk: episodes not yet released (after a crash, the unfinished ones)."""
        return sorted(self.directory.glob(f"*{SUFFIX}"))

    def discard_training(self) -> int:
        """Remove the journals of training episodes (blocking reads: off the loop); how many. For the end of
        training: the episodes it cancelled will never be continued or trained."""
        found = 0
        for path in self.files():
            begin = first_event(path)
            if begin is None or (begin[0] == "begin" and begin[1].get("training", True)):
                self.submit(path, None)
                found += 1
        return found

    # -- the loop's side ---------------------------------------------------------------------

    def submit(self, path: Path, body: Body | None) -> int:
        """Queue a frame body for `path` (None: remove the file after what is queued before it); its seq.
        The body's buffers must not change until the frame is written (the arrays of a finished turn)."""
        if self._stopping:
            raise RuntimeError("journal is closed")
        size = 0 if body is None else sum(map(len, body))  # pack_parts' parts: bytes and flat byte memoryviews
        with self._cv:
            seq = self._next_seq
            self._next_seq += 1
            self._queue.append((seq, path, body, size))
            self._backlog_bytes += size
        return seq

    def _hurry_writer(self) -> None:
        with self._cv:
            self._hurry = True
            self._cv.notify()

    async def room(self) -> None:
        """Until the frames waiting to be written are within `max_backlog_bytes` (the back-pressure)."""
        if self._backlog_bytes <= self.max_backlog_bytes:
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        fut = loop.create_future()
        self._room_waiters.append(fut)
        if self._backlog_bytes <= self.max_backlog_bytes:  # the thread may have drained it meanwhile
            self._wake()
        self._hurry_writer()
        await fut

    async def written(self, seq: int) -> None:
        """Until the frame `seq` (and every one before it) is in its file."""
        if self._written >= seq:
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        fut = loop.create_future()
        heapq.heappush(self._waiters, (seq, id(fut), fut))
        if self._written >= seq:  # the thread may have passed before the waiter was added
            self._wake()
        self._hurry_writer()
        await fut

    async def drained(self) -> None:
        """Until everything submitted so far is written."""
        await self.written(self._next_seq - 1)

    def _wake(self) -> None:
        while self._waiters and self._waiters[0][0] <= self._written:
            fut = heapq.heappop(self._waiters)[2]
            if not fut.done():
                fut.set_result(None)
        if self._backlog_bytes <= self.max_backlog_bytes:
            waiters, self._room_waiters = self._room_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def close(self) -> None:
        """Write what is queued (one try each while writes fail), sync, stop the thread. The files stay: the
        next start ends their episodes (t1/coordinator/spool/journal_recovery.py)."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join()

    # -- the writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        last_sync = time.monotonic()
        while True:
            with self._cv:
                if not self._stopping and not self._hurry:
                    self._cv.wait(WRITE_EVERY_S)  # close, an export or the back-pressure wakes it early
                self._hurry = False
                batch = list(self._queue)
                self._queue.clear()
                stopping = self._stopping
            for path, bodies, size in _by_file(batch):
                self._apply(path, bodies, size)
                if bodies:
                    with self._cv:
                        self._backlog_bytes -= size
                    if self._room_waiters and self._backlog_bytes <= self.max_backlog_bytes and self._loop is not None:
                        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
                            self._loop.call_soon_threadsafe(self._wake)
            if batch:
                self._written = batch[-1][0]
                m.JOURNAL_BACKLOG.set(self._backlog_bytes)
                if (self._waiters or self._room_waiters) and self._loop is not None:
                    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
                        self._loop.call_soon_threadsafe(self._wake)
            now = time.monotonic()
            if self._dirty and self.fsync_window_s and (stopping or now - last_sync >= self.fsync_window_s):
                self._sync()
                last_sync = now
            if stopping and not self._queue:
                return

    def _apply(self, path: Path, bodies: list[tuple[Body, int]] | None, size: int) -> None:
        """Append `bodies` (frame bodies with their sizes) to `path` in one write, or remove it (None)."""
        delay = RETRY_FIRST_S
        while True:
            try:
                if bodies is None:
                    path.unlink(missing_ok=True)
                    self._dirty.discard(path)
                else:
                    _append(path, bodies)
                    self.frames += len(bodies)
                    written = sf.HEADER.size * len(bodies) + size
                    self.bytes += written
                    m.JOURNAL_BYTES.inc(written)
                    self._dirty.add(path)
                if self.write_error:
                    log.warning("journal writes succeed again (%s cleared)", self.write_error)
                    self.write_error = ""
                    m.JOURNAL_WRITE_FAILING.set(0)
                return
            except OSError as exc:
                self.write_errors += 1
                m.JOURNAL_WRITE_ERRORS.inc()
                if not self.write_error:
                    log.error("journal write failed: %s: %s; holding the episodes' turns in memory, retrying",
                              path, exc)
                self.write_error = f"{path}: {exc}"
                m.JOURNAL_WRITE_FAILING.set(1)
                if self._stopping:  # closing: no more retries (the episode's journal ends before this frame)
                    log.error("journal closing while writes fail: %s loses a frame", path)
                    return
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    def _sync(self) -> None:
        """Everything written so far to the disk: one syncfs for the file system, else an fsync per file."""
        try:
            if _SYNCFS is not None:
                fd = os.open(self.directory, os.O_RDONLY)
                try:
                    if _SYNCFS(fd) != 0:
                        raise OSError(ctypes.get_errno(), "syncfs failed")
                finally:
                    os.close(fd)
            else:
                for path in self._dirty:
                    with contextlib.suppress(FileNotFoundError):
                        fd = os.open(path, os.O_RDONLY)
                        try:
                            os.fsync(fd)
                        finally:
                            os.close(fd)
        except OSError as exc:  # the next window tries again; the frames are in the page cache
            m.JOURNAL_WRITE_ERRORS.inc()
            log.warning("journal sync failed: %s", exc)
            return
        self._dirty.clear()
        self.syncs += 1
        m.JOURNAL_SYNCS.inc()


def _by_file(batch: list[tuple[int, Path, Body | None, int]]
             ) -> Iterator[tuple[Path, list[tuple[Body, int]] | None, int]]:
    """A batch as writes per file, each file's frames in order: (path, [(body, size)], bytes) to append in one
    open and write, or (path, None, 0) where a removal was queued (after that file's frames before it)."""
    frames: dict[Path, list[tuple[Body, int]]] = {}
    for _, path, body, size in batch:
        if body is not None:
            frames.setdefault(path, []).append((body, size))
            continue
        queued = frames.pop(path, None)
        if queued:
            yield path, queued, sum(n for _, n in queued)
        yield path, None, 0
    for path, queued in frames.items():
        yield path, queued, sum(n for _, n in queued)


def _append(path: Path, bodies: list[tuple[Body, int]]) -> None:
    """Frames at the end of `path` (one open, one write of them all); a failed write is cut off again (else a torn
    tail, which reading stops at)."""
    parts: list[Any] = []  # bytes and flat byte memoryviews (pack_parts'), as writev takes them
    for body, size in bodies:
        crc = 0
        for part in body:
            crc = sf.crc32(part, crc)
        parts.append(sf.HEADER.pack(size, crc))
        parts.extend(body)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            while parts:  # writev may write less than asked, and takes at most IOV_MAX buffers
                n = os.writev(fd, parts[:IOV_MAX])
                while parts and n >= len(parts[0]):
                    n -= len(parts.pop(0))
                if parts:
                    parts[0] = memoryview(parts[0])[n:]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def first_event(path: Path) -> Event | None:
    """A journal's first record (its begin), or None when it has no intact one."""
    with path.open("rb") as f:
        head = f.read(sf.HEADER.size)
        if len(head) < sf.HEADER.size:
            return None
        body = f.read(sf.HEADER.unpack(head)[0])
    events, _ = _decode_frames(head + body)
    return events[0] if events else None


def read_events(path: Path) -> tuple[list[Event], int]:
    """Every intact frame of a journal file, in order, and the bytes after the last one (a torn tail: a
    crash during its write). Reading stops at the first frame that is short, fails its checksum or does
    not decode: what follows it cannot be replayed in order."""
    return _decode_frames(path.read_bytes())


def read_frames(path: Path) -> list[tuple[Event, int]]:
    """Every intact frame of a journal file with the offset just after it (where a file cut there ends)."""
    ends: list[int] = []
    events, _ = _decode_frames(path.read_bytes(), ends)
    return list(zip(events, ends, strict=True))


def cut(path: Path, size: int) -> None:
    """Truncate a journal to its first `size` bytes (frames after a resume point: the turn that was in flight,
    a torn tail) and sync it, so the frames a resumed episode appends follow its last kept one."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _decode_frames(data: bytes, ends: list[int] | None = None) -> tuple[list[Event], int]:
    events: list[Event] = []
    pos = 0
    while pos + sf.HEADER.size <= len(data):
        length, crc = sf.HEADER.unpack_from(data, pos)
        end = pos + sf.HEADER.size + length
        if end > len(data):
            break
        body = data[pos + sf.HEADER.size:end]
        if sf.crc32(body) != crc:
            break
        try:
            kind, fields = unpack_obj(body)
        except (CodecError, TypeError, ValueError):
            break
        if not isinstance(kind, str) or not isinstance(fields, dict):
            break
        events.append((kind, fields))
        pos = end
        if ends is not None:
            ends.append(end)
    return events, len(data) - pos


class EpisodeJournal:
    """One episode's journal: the BufferSink of its TokenBuffer, and the episode's own records."""

    __slots__ = ("_journal", "_last", "episode_id", "path", "training")

    def __init__(self, journal: Journal, episode_id: str, training: bool = True) -> None:
        self._journal = journal
        self.episode_id = episode_id
        self.training = training
        self.path = journal.path_of(episode_id)
        self._last = -1

    def _emit(self, kind: str, fields: Mapping[str, Any]) -> None:
        self._last = self._journal.submit(self.path, pack_parts([kind, fields]))

    def begin(self, **fields: Any) -> None:
        self._emit("begin", {"episode_id": self.episode_id, "training": self.training, **fields})

    def turn(self, **fields: Any) -> None:
        self._emit("turn", fields)

    def sandbox(self, **fields: Any) -> None:
        self._emit("sandbox", fields)

    def ready(self, **fields: Any) -> None:
        self._emit("ready", fields)

    def resumed(self, **fields: Any) -> None:
        self._emit("resumed", fields)

    # BufferSink
    def segment(self, ids: np.ndarray, messages: Sequence[Message], shared_prefix: int) -> None:
        self._emit("segment", {"ids": ids, "messages": list(messages), "shared": shared_prefix})

    def generation(self, start: int, ids: np.ndarray, logprobs: np.ndarray, versions: np.ndarray,
                   routing: RoutingBlock | None, message: Message, repair: np.ndarray, summary: bool = False) -> None:
        self._emit("gen", {"start": start, "ids": ids, "logprobs": logprobs, "versions": versions,
                           "routing_start": None if routing is None else routing.start,
                           "routing": None if routing is None else routing.experts,
                           "message": message, "repair": repair, **({"summary": True} if summary else {})})

    def context(self, ids: np.ndarray, messages: Sequence[Message]) -> None:
        self._emit("ctx", {"ids": ids, "messages": list(messages)})

    async def room(self) -> None:
        await self._journal.room()

    async def written(self) -> None:
        """Until every record of this episode so far is in its file (readable by `read`)."""
        await self._journal.written(self._last)

    def read(self) -> list[Event]:
        """The episode's records (blocking file I/O: call it off the loop, after `written`)."""
        events, torn = read_events(self.path)
        if torn:
            raise CodecError(f"{self.path}: {torn} bytes after the last intact record")
        return events

    def release(self) -> None:
        """The episode's trajectory is spooled (or needs no journal any more): its file goes."""
        self._journal.submit(self.path, None)
