"""The msgpack trajectory codec: the bytes the spool stores and the trainer stream carries.

A trajectory is one msgpack map (schema version "v"); every numpy array is an ExtType (code 1)
whose payload is a small header (dtype string, shape) followed by the array's raw little-endian
bytes, so encoding is one memcpy per array and decoding is a zero-copy, read-only numpy view on the
message bytes. Decoding checks the schema and that a segment's arrays are aligned by position.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

import msgpack
import numpy as np

from t1.errors import DataError
from t1.trajectory.types import (
    EpisodeStatus,
    Segment,
    TitoCounters,
    Trajectory,
    TurnSpan,
    VerifierSummary,
)

SCHEMA_VERSION = 1
NDARRAY_EXT = 1
_ALLOWED_DTYPES = frozenset(np.dtype(d).str for d in ("<i4", "<f4", "|b1", "|u1", "<u2", "<i8", "<f8"))
_HEADER = struct.Struct("<B B")  # dtype-string length, ndim


class CodecError(DataError, ValueError):
    """Bytes that are not a valid trajectory record; the message names the field."""


def _pack_array(arr: np.ndarray) -> msgpack.ExtType:
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    code = dt.str.encode()
    head = _HEADER.pack(len(code), arr.ndim) + code + struct.pack(f"<{arr.ndim}Q", *arr.shape)
    body = np.ascontiguousarray(arr, dtype=dt).reshape(-1)  # flat: an empty (0, 48, 8) array has no byte view
    # one copy: join reads the array's buffer directly (tobytes + concatenation would copy twice)
    raw = memoryview(body).cast("B")  # type: ignore[arg-type]
    return msgpack.ExtType(NDARRAY_EXT, b"".join((head, raw)))


def _unpack_array(data: bytes) -> np.ndarray:
    view = memoryview(data)
    code_len, ndim = _HEADER.unpack_from(view, 0)
    off = _HEADER.size
    dtype_str = bytes(view[off:off + code_len]).decode()
    off += code_len
    if dtype_str not in _ALLOWED_DTYPES:
        raise CodecError(f"array dtype {dtype_str!r} is not one of {sorted(_ALLOWED_DTYPES)}")
    shape = struct.unpack_from(f"<{ndim}Q", view, off)
    off += 8 * ndim
    dt = np.dtype(dtype_str)
    count = int(np.prod(shape, dtype=np.int64))
    if len(view) - off != count * dt.itemsize:
        raise CodecError(f"array of shape {list(shape)} {dt} needs {count * dt.itemsize} bytes, has {len(view) - off}")
    return np.frombuffer(view, dtype=dt, count=count, offset=off).reshape(shape)


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _pack_array(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} in a trajectory")


def _ext_hook(code: int, data: bytes) -> Any:
    if code != NDARRAY_EXT:
        raise CodecError(f"unknown msgpack extension type {code}")
    return _unpack_array(data)


def _segment_to_obj(s: Segment) -> dict[str, Any]:
    return {"token_ids": s.token_ids, "logprobs": s.logprobs, "loss_mask": s.loss_mask,
            "policy_versions": s.policy_versions, "routing": s.routing,
            "turns": [[t.start, t.end, t.reward] for t in s.turns]}


def trajectory_to_obj(t: Trajectory) -> dict[str, Any]:
    """The msgpack-ready map of a trajectory (numpy arrays left as arrays)."""
    return {
        "v": SCHEMA_VERSION, "id": t.id, "task_id": t.task_id, "group_id": t.group_id, "attempt": t.attempt,
        "segments": [_segment_to_obj(s) for s in t.segments], "reward": t.reward, "status": str(t.status),
        "verifier": {"passed": t.verifier.passed, "total": t.verifier.total,
                     "tests": [list(x) for x in t.verifier.tests]},
        "timings": [[k, v] for k, v in t.timings],
        "tito": {"repaired_turns": t.tito.repaired_turns, "masked_tokens": t.tito.masked_tokens,
                 "template_mismatches": t.tito.template_mismatches},
    }


def encode_trajectory(t: Trajectory) -> bytes:
    """One trajectory as msgpack bytes: msgpack.packb(trajectory_to_obj(t), default=_default), built in one copy.

    The array bytes (tens of MB of routing) are not copied into an ExtType and then into msgpack's
    growing buffer: every small part is packed by msgpack, arrays are framed here, and one join
    copies each array's buffer once into the record.
    """
    parts: list[Any] = []
    _pack_into(trajectory_to_obj(t), parts, _packer())
    return b"".join(parts)


_local = threading.local()


def _packer(arrays: bool = True) -> msgpack.Packer:
    """This thread's packer (autoreset, so each pack returns its own bytes): with `arrays`, numpy arrays as the
    ndarray extension; without, packing what holds an array raises TypeError. Made once: a packer's first buffer
    is 1 MB, and a new one per value (msgpack.packb) cost a turn's journal frames 0.3 ms of page faults."""
    name = "packer" if arrays else "plain"
    packer = getattr(_local, name, None)
    if packer is None:
        packer = msgpack.Packer(use_bin_type=True, default=_default if arrays else None)
        setattr(_local, name, packer)
    return packer


def _pack_into(obj: Any, parts: list[Any], packer: msgpack.Packer) -> None:
    """Append the msgpack bytes of obj to parts (byte-identical to packb): arrays are framed in place, a dict or
    list that holds one is walked, anything else is packed whole in one call. Whether a container holds an array
    is what packing it without arrays says (a TypeError, the packer reset): asking in Python cost a turn's journal
    frames more than packing them (6 us a record)."""
    if isinstance(obj, np.ndarray):
        _array_parts(obj, parts)
        return
    if isinstance(obj, (dict, list)):
        try:
            parts.append(_packer(arrays=False).pack(obj))
            return
        except TypeError:  # it holds an array (or something no packer takes: the walk reaches it and says so)
            pass
        if isinstance(obj, dict):
            parts.append(packer.pack_map_header(len(obj)))
            for k, v in obj.items():
                parts.append(_key(k, packer))
                _pack_into(v, parts, packer)
        else:
            parts.append(packer.pack_array_header(len(obj)))
            for v in obj:
                _pack_into(v, parts, packer)
        return
    parts.append(packer.pack(obj))


def _key(k: Any, packer: msgpack.Packer) -> bytes:
    """A walked map's key, packed (a str key once)."""
    packed = _KEYS.get(k) if isinstance(k, str) else None
    if packed is None:
        packed = packer.pack(k)
        if isinstance(k, str) and len(_KEYS) < _MAX_KEYS:
            _KEYS[k] = packed
    return packed


def _array_parts(arr: np.ndarray, parts: list[Any]) -> None:
    """The ExtType of _pack_array(arr) as parts: ext header, array header, the array's own buffer (one part, a
    copy, for an array under JOINED_ARRAY_BYTES)."""
    known = _ARRAY_HEADS.get((arr.dtype, arr.ndim))
    if known is None:
        dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        code = dt.str.encode()
        known = _ARRAY_HEADS[(arr.dtype, arr.ndim)] = (dt, _HEADER.pack(len(code), arr.ndim) + code,
                                                       struct.Struct(f"<{arr.ndim}Q"))
    dt, head, shape = known
    if dt is not arr.dtype or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=dt)
    head += shape.pack(*arr.shape)
    body = memoryview(arr if arr.size else arr.reshape(-1)).cast("B")  # type: ignore[arg-type]  # (0, 48, 8): no cast
    n = len(head) + body.nbytes
    if n in _FIXEXT:
        ext = bytes((_FIXEXT[n], NDARRAY_EXT))
    elif n < 1 << 8:
        ext = bytes((0xC7, n, NDARRAY_EXT))
    elif n < 1 << 16:
        ext = _EXT16.pack(0xC8, n, NDARRAY_EXT)
    else:
        ext = _EXT32.pack(0xC9, n, NDARRAY_EXT)
    if body.nbytes < JOINED_ARRAY_BYTES:  # one small part: fewer checksum steps and write buffers than three
        parts.append(b"".join((ext, head, body)))
    else:
        parts += (ext, head, body)


# (dtype, ndim) -> (little-endian dtype, array header without its shape, the shape's struct): a turn's journal
# frames pack five arrays, and building these each time was most of their cost.
_ARRAY_HEADS: dict[tuple[np.dtype[Any], int], tuple[np.dtype[Any], bytes, struct.Struct]] = {}
JOINED_ARRAY_BYTES = 4096  # arrays below this are copied into one part with their headers; bigger ones are not copied
_EXT16, _EXT32 = struct.Struct(">BHB"), struct.Struct(">BIB")
_FIXEXT = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
_KEYS: dict[str, bytes] = {}  # map keys of the walked records (journal frames, trajectories), each packed once
_MAX_KEYS = 256  # the code's own field names are a few dozen; a record with arbitrary keys packs the rest each time


def _field(obj: dict[str, Any], key: str, where: str) -> Any:
    try:
        return obj[key]
    except (KeyError, TypeError):
        raise CodecError(f"{where}: missing field {key!r}") from None


def _segment_from_obj(obj: dict[str, Any], where: str) -> Segment:
    arrays = {k: _field(obj, k, where) for k in ("token_ids", "logprobs", "loss_mask", "policy_versions")}
    routing = _field(obj, "routing", where)
    for k, want in (("token_ids", "int32"), ("logprobs", "float32"), ("loss_mask", "bool"),
                    ("policy_versions", "int32")):
        a = arrays[k]
        if not isinstance(a, np.ndarray) or a.ndim != 1 or a.dtype != np.dtype(want):
            raise CodecError(f"{where}.{k}: expected a 1-d {want} array, got {getattr(a, 'dtype', type(a))}")
    n = arrays["token_ids"].shape[0]
    for k, a in arrays.items():
        if a.shape[0] != n:
            raise CodecError(f"{where}.{k}: has {a.shape[0]} positions, token_ids has {n}")
    if routing is not None and (not isinstance(routing, np.ndarray) or routing.ndim != 3 or routing.shape[0] != n
                                or routing.dtype not in (np.uint8, np.uint16)):
        raise CodecError(f"{where}.routing: expected uint8/uint16 [{n}, layers, top_k], got "
                         f"{getattr(routing, 'shape', type(routing))}")
    turns = tuple(TurnSpan(int(a), int(b), float(r)) for a, b, r in _field(obj, "turns", where))
    return Segment(routing=routing, turns=turns, **arrays)


def trajectory_from_obj(obj: Any) -> Trajectory:
    """Inverse of trajectory_to_obj, with schema checks that name the bad field."""
    if not isinstance(obj, dict):
        raise CodecError(f"trajectory: expected a map, got {type(obj).__name__}")
    if _field(obj, "v", "trajectory") != SCHEMA_VERSION:
        raise CodecError(f"trajectory: schema version {obj['v']} is not {SCHEMA_VERSION}")
    try:
        status = EpisodeStatus(_field(obj, "status", "trajectory"))
    except ValueError:
        raise CodecError(f"trajectory.status: {obj['status']!r} is not one of "
                         f"{[s.value for s in EpisodeStatus]}") from None
    ver, tito = _field(obj, "verifier", "trajectory"), _field(obj, "tito", "trajectory")
    return Trajectory(
        id=_field(obj, "id", "trajectory"), task_id=_field(obj, "task_id", "trajectory"),
        group_id=_field(obj, "group_id", "trajectory"), attempt=int(_field(obj, "attempt", "trajectory")),
        segments=tuple(_segment_from_obj(s, f"trajectory.segments[{i}]")
                       for i, s in enumerate(_field(obj, "segments", "trajectory"))),
        reward=float(_field(obj, "reward", "trajectory")), status=status,
        verifier=VerifierSummary(passed=int(_field(ver, "passed", "trajectory.verifier")),
                                 total=int(_field(ver, "total", "trajectory.verifier")),
                                 tests=tuple((str(a), str(b)) for a, b in _field(ver, "tests", "trajectory.verifier"))),
        timings=tuple((str(k), float(v)) for k, v in _field(obj, "timings", "trajectory")),
        tito=TitoCounters(**{k: int(_field(tito, k, "trajectory.tito"))
                             for k in ("repaired_turns", "masked_tokens", "template_mismatches")}),
    )


def decode_trajectory(data: bytes) -> Trajectory:
    """Trajectory from bytes made by encode_trajectory; arrays are read-only views on `data`."""
    try:
        obj = msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=True)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
        if isinstance(exc, CodecError):
            raise
        raise CodecError(f"trajectory: not a msgpack record ({exc})") from exc
    return trajectory_from_obj(obj)


def pack_parts(items: list[Any]) -> list[Any]:
    """The msgpack bytes of the list `items` as parts (bytes, and memoryviews of the arrays' own buffers: no
    copy of an array), numpy arrays as this codec's ndarray extension: the episode journal's frame bodies.
    b"".join(parts) == msgpack.packb(items, default=...) byte for byte."""
    packer = _packer()
    parts: list[Any] = [packer.pack_array_header(len(items))]
    for item in items:
        _pack_into(item, parts, packer)
    return parts


def unpack_obj(data: bytes) -> Any:
    """Inverse of pack_parts; arrays are read-only views on `data`."""
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=True)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
        if isinstance(exc, CodecError):
            raise
        raise CodecError(f"not a msgpack record ({exc})") from exc


def iter_trajectories(stream: BinaryIO, max_record_bytes: int = 1 << 31) -> Iterator[Trajectory]:
    """Trajectories from a file of concatenated encode_trajectory records (a spool file)."""
    unpacker = msgpack.Unpacker(stream, ext_hook=_ext_hook, raw=False, max_buffer_size=max_record_bytes,
                                read_size=min(1 << 24, max_record_bytes))  # big reads: records are MBs
    for obj in unpacker:
        yield trajectory_from_obj(obj)
