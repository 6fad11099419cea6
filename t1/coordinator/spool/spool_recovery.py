"""Spool recovery: find every intact frame of a damaged file, keep the damaged bytes, say what was lost.

A scan walks a file frame by frame (`spool_files` format). Where a frame is short, fails its
checksum or does not decode, the scan resynchronises: it searches forward for the next offset
that starts an intact frame and records the bytes in between as one damaged range. So a bad
length field, a flipped byte or a garbage block costs the frames it touches, never the rest of
the file. `repair` keeps the original bytes in a `.corrupt` side file next to it (a hard link,
so nothing is copied), then atomically rewrites the file with its intact frames only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from t1.metrics import registry as m
from t1.trajectory import spool_files as sf

log = logging.getLogger(__name__)

# A body check: None when the body is a well-formed record, else why not.
BodyCheck = Callable[[bytes], str | None]
CORRUPT_SUFFIX = ".corrupt"
TMP_SUFFIX = ".tmp"


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes [start, end) of a file that hold no intact frame, and what was wrong at `start`."""

    start: int
    end: int
    reason: str


@dataclass(frozen=True, slots=True)
class FileScan:
    """Every intact frame of a file (its offset and body) and every damaged range between them."""

    path: Path
    size: int
    frames: tuple[tuple[int, bytes], ...]
    damage: tuple[Damage, ...]

    @property
    def damaged_bytes(self) -> int:
        return sum(d.end - d.start for d in self.damage)

    def describe(self, side: Path | None = None) -> str:
        ranges = ", ".join(f"bytes {d.start}-{d.end} ({d.reason})" for d in self.damage)
        kept = f"; the original bytes are kept in {side}" if side else ""
        return (f"{self.path}: {len(self.damage)} damaged ranges, {self.damaged_bytes} bytes, at least "
                f"{len(self.damage)} records lost: {ranges}; {len(self.frames)} intact records kept{kept}")


def record_check(body: bytes) -> str | None:
    try:
        sf.decode_record(body, Path("-"))
    except sf.SpoolCorrupt as exc:
        return str(exc).removeprefix("-: ")
    return None


def ack_check(body: bytes) -> str | None:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return "ack id is not UTF-8"
    return None


def _frame_at(data: bytes, pos: int, check: BodyCheck) -> tuple[int, str | None]:
    """(end of the frame at pos, None) when it is intact, else (0, why not)."""
    if pos + sf.HEADER.size > len(data):
        return 0, f"{len(data) - pos} bytes, too short for a frame header"
    length, crc = sf.HEADER.unpack_from(data, pos)
    end = pos + sf.HEADER.size + length
    if length == 0 or end > len(data):
        return 0, f"frame length {length} runs past the end of the file"
    body = data[pos + sf.HEADER.size : end]
    if sf.crc32(body) != crc:
        return 0, "checksum mismatch"
    reason = check(body)
    return (0, reason) if reason else (end, None)


def _resync(data: bytes, start: int, check: BodyCheck, first_byte: int | None) -> int:
    """The first offset >= start that begins an intact frame, or len(data)."""
    pos = start
    while pos + sf.HEADER.size < len(data):
        if first_byte is not None:  # jump to the next place a body could start
            hit = data.find(bytes([first_byte]), pos + sf.HEADER.size)
            if hit < 0:
                break
            pos = hit - sf.HEADER.size
        if _frame_at(data, pos, check)[0]:
            return pos
        pos += 1
    return len(data)


def scan_bytes(data: bytes, path: Path, check: BodyCheck, first_byte: int | None = None) -> FileScan:
    frames: list[tuple[int, bytes]] = []
    damage: list[Damage] = []
    pos = 0
    while pos < len(data):
        end, reason = _frame_at(data, pos, check)
        if reason is None:
            frames.append((pos, data[pos + sf.HEADER.size : end]))
            pos = end
            continue
        nxt = _resync(data, pos + 1, check, first_byte)
        damage.append(Damage(pos, nxt, reason))
        pos = nxt
    return FileScan(path, len(data), tuple(frames), tuple(damage))


def scan_segment(path: Path) -> FileScan:
    return scan_bytes(path.read_bytes(), path, record_check, first_byte=0x92)  # a record body is a msgpack 2-array


def scan_acks(path: Path) -> FileScan:
    return scan_bytes(path.read_bytes(), path, ack_check)


def side_path(path: Path) -> Path:
    side = path.with_name(path.name + CORRUPT_SUFFIX)
    n = 1
    while side.exists():
        side = path.with_name(f"{path.name}{CORRUPT_SUFFIX}.{n}")
        n += 1
    return side


def repair(scan: FileScan) -> Path:
    """Keep the damaged file as a side file, then replace it with its intact frames; returns the side file."""
    path = scan.path
    side = side_path(path)
    try:
        os.link(path, side)
    except OSError:
        shutil.copyfile(path, side)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with tmp.open("wb") as f:
        for _, body in scan.frames:
            f.write(sf.encode_frame(body))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    sf.fsync_dir(path.parent)
    return side


def remove_leftovers(directory: Path) -> None:
    """Temporary files of a repair or ack compaction that a crash interrupted (their originals are intact)."""
    for tmp in directory.glob(f"*{TMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            tmp.unlink()


def _recover(scan: FileScan) -> FileScan:
    if scan.damage:
        side = repair(scan)
        m.SPOOL_DAMAGED_BYTES.inc(scan.damaged_bytes)
        m.SPOOL_DAMAGED_RANGES.inc(len(scan.damage))
        log.warning("spool recovery: %s", scan.describe(side))
    return scan


def load_segment(directory: Path, index: int) -> list[sf.Record]:
    """Every intact record of one segment; damage is moved to a side file and reported."""
    scan = _recover(scan_segment(sf.segment_path(directory, index)))
    return [sf.Record(*sf.decode_record(body, scan.path), index) for _, body in scan.frames]


def load_acks(directory: Path) -> set[str]:
    """Every intact id of the ack log (a lost ack only means that record is sent again, a duplicate)."""
    path = directory / sf.ACK_LOG
    if not path.exists():
        return set()
    return {body.decode("utf-8") for _, body in _recover(scan_acks(path)).frames}
