"""On-disk frames of the spool: length-prefixed, CRC-checked records in segment files and an ack log.

A frame is `u32 length | u32 crc32(body) | body` (little-endian). A spool record's body is
msgpack `[trajectory_id, payload]`; an ack-log frame's body is the acknowledged id (UTF-8).
Reading a file back, and recovering one that is torn or damaged, is t1/coordinator/spool/spool_recovery.py.
The CRC is zlib's CRC-32, computed by ISA-L (the same values, an order of magnitude faster).
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import msgpack
from isal.isal_zlib import crc32

from t1.errors import DataError

HEADER = struct.Struct("<II")
MAX_FRAME_BYTES = 1 << 31
SEGMENT_PREFIX = "seg-"
SEGMENT_SUFFIX = ".spool"
ACK_LOG = "acks.log"


class SpoolCorrupt(DataError):
    """A frame's body is not a spool record: the file was damaged on disk."""


@dataclass(frozen=True, slots=True)
class Record:
    """One spooled trajectory: its id, the exact msgpack payload, and where it lives."""

    trajectory_id: str
    payload: bytes
    segment: int

    @property
    def size(self) -> int:
        return len(self.payload)


def encode_frame(body: bytes) -> bytes:
    return HEADER.pack(len(body), crc32(body)) + body


def encode_record(trajectory_id: str, payload: bytes) -> bytes:
    return encode_frame(msgpack.packb([trajectory_id, payload], use_bin_type=True))


def record_head(trajectory_id: str, payload_len: int) -> bytes:
    """The msgpack bytes of a record body before its payload: `[trajectory_id, bin header]`.

    body = record_head(id, len(payload)) + payload is exactly encode_record's body, built without
    copying a payload of tens of MB.
    """
    if payload_len < 1 << 8:
        bin_head = struct.pack(">BB", 0xC4, payload_len)
    elif payload_len < 1 << 16:
        bin_head = struct.pack(">BH", 0xC5, payload_len)
    elif payload_len < 1 << 32:
        bin_head = struct.pack(">BI", 0xC6, payload_len)
    else:
        raise ValueError(f"a spool payload is at most 4 GiB, got {payload_len} bytes")
    return b"\x92" + msgpack.packb(trajectory_id, use_bin_type=True) + bin_head


def record_frame_size(head: bytes, payload_len: int) -> int:
    return HEADER.size + len(head) + payload_len


def write_record(fd: int, head: bytes, payload: bytes) -> None:
    """Write the frame of encode_record(id, payload) given record_head(id, len(payload)), in place of a copy.

    Pure C work on the payload (CRC, write) that releases the GIL: meant for a worker thread.
    """
    crc = crc32(payload, crc32(head))
    for part in (HEADER.pack(len(head) + len(payload), crc) + head, payload):
        view = memoryview(part)
        while view:  # os.write may write less than asked (a signal, a nearly full disk)
            view = view[os.write(fd, view):]


def append_record(path: Path, head: bytes, payload: bytes, fsync: bool) -> None:
    """Append one frame to `path`; a write that fails leaves the file as it was (the partial frame cut off).

    A tail left behind would hold disk space nobody accounts for: on a full disk every failed retry would
    eat what acknowledgements freed. If the cut fails too, the damage is a torn tail, which recovery skips.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            write_record(fd, head, payload)
            if fsync:
                os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
                if start == 0:
                    path.unlink()
            raise
    finally:
        os.close(fd)


def decode_record(body: bytes, path: Path) -> tuple[str, bytes]:
    try:
        tid, payload = msgpack.unpackb(body, raw=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise SpoolCorrupt(f"{path}: record is not msgpack [id, payload] ({exc})") from None
    if not isinstance(tid, str) or not isinstance(payload, bytes):
        raise SpoolCorrupt(f"{path}: record is not [str id, bytes payload]")
    return tid, payload


def segment_path(directory: Path, index: int) -> Path:
    return directory / f"{SEGMENT_PREFIX}{index:08d}{SEGMENT_SUFFIX}"


def list_segments(directory: Path) -> list[int]:
    found = []
    for p in directory.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}"):
        stem = p.name[len(SEGMENT_PREFIX) : -len(SEGMENT_SUFFIX)]
        if stem.isdigit():
            found.append(int(stem))
    return sorted(found)


def rewrite_acks(directory: Path, ids: set[str]) -> None:
    """Atomically replace the ack log with only `ids` (compaction after whole segments are gone)."""
    tmp = directory / (ACK_LOG + ".tmp")
    with tmp.open("wb") as f:
        for tid in sorted(ids):
            f.write(encode_frame(tid.encode("utf-8")))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / ACK_LOG)
    fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
