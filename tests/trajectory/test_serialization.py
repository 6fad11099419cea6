"""The msgpack trajectory codec: exact round trip, zero-copy views, streams, and clear errors on bad bytes."""

from __future__ import annotations

import dataclasses
import io

import msgpack
import numpy as np
import pytest

from t1.trajectory.serialization import (
    CodecError,
    decode_trajectory,
    encode_trajectory,
    iter_trajectories,
    trajectory_to_obj,
)
from t1.trajectory.types import (
    EpisodeStatus,
    Segment,
    TitoCounters,
    Trajectory,
    TurnSpan,
    VerifierSummary,
)


def make(n: int = 50, routing_dtype=np.uint8, seed: int = 0) -> Trajectory:
    rng = np.random.default_rng(seed)
    mask = rng.random(n) < 0.5
    seg = Segment(
        token_ids=rng.integers(0, 50000, n).astype(np.int32),
        logprobs=np.where(mask, -rng.random(n), np.nan).astype(np.float32), loss_mask=mask,
        policy_versions=np.where(mask, 4, -1).astype(np.int32),
        routing=rng.integers(0, 300 if routing_dtype == np.uint16 else 255, (n, 3, 2)).astype(routing_dtype),
        turns=(TurnSpan(3, 9, 0.5), TurnSpan(12, 20, -1.0)))
    return Trajectory(id="traj-1", task_id="task", group_id="grp", attempt=2, segments=(seg, seg), reward=3.0,
                      status=EpisodeStatus.CONTEXT_LIMIT, verifier=VerifierSummary(2, 5, (("t1", "passed"),)),
                      timings=(("rollout_s", 1.5),), tito=TitoCounters(1, 2, 3))


def assert_same(a: Trajectory, b: Trajectory) -> None:
    assert (a.id, a.task_id, a.group_id, a.attempt, a.reward, a.status, a.verifier, a.timings, a.tito) == \
        (b.id, b.task_id, b.group_id, b.attempt, b.reward, b.status, b.verifier, b.timings, b.tito)
    for x, y in zip(a.segments, b.segments, strict=True):
        for name in ("token_ids", "logprobs", "loss_mask", "policy_versions", "routing"):
            u, v = getattr(x, name), getattr(y, name)
            assert u.dtype == v.dtype and np.array_equal(u, v, equal_nan=name == "logprobs"), name
        assert x.turns == y.turns


@pytest.mark.parametrize("routing_dtype", [np.uint8, np.uint16])
def test_round_trip_is_exact(routing_dtype):
    t = make(routing_dtype=routing_dtype)
    back = decode_trajectory(encode_trajectory(t))
    assert_same(t, back)
    assert not back.segments[0].token_ids.flags.writeable  # a view on the message bytes


def test_segment_without_routing_and_empty_segment_round_trip():
    t = make()
    empty = Segment(np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(0, bool), np.zeros(0, np.int32), None)
    t2 = Trajectory(
        id="x", task_id="t", group_id="g", attempt=0, segments=(empty,), reward=0.0, status=EpisodeStatus.OK
    )
    assert decode_trajectory(encode_trajectory(t2)).segments[0].routing is None
    assert_same(t, decode_trajectory(encode_trajectory(t)))


def test_stream_of_records():
    buf = io.BytesIO(b"".join(encode_trajectory(make(seed=i)) for i in range(3)))
    got = list(iter_trajectories(buf))
    for i, t in enumerate(got):
        assert_same(make(seed=i), t)


def test_bad_bytes_name_the_field():
    obj = trajectory_to_obj(make())
    obj["status"] = "exploded"
    from t1.trajectory.serialization import _default

    with pytest.raises(CodecError, match="status"):
        decode_trajectory(msgpack.packb(obj, default=_default))
    obj = trajectory_to_obj(make())
    obj["segments"][1]["loss_mask"] = obj["segments"][1]["loss_mask"][:-1]
    with pytest.raises(CodecError, match=r"segments\[1\]\.loss_mask"):
        decode_trajectory(msgpack.packb(obj, default=_default))
    obj = trajectory_to_obj(make())
    del obj["reward"]
    with pytest.raises(CodecError, match="reward"):
        decode_trajectory(msgpack.packb(obj, default=_default))
    with pytest.raises(CodecError, match="not a msgpack record"):
        decode_trajectory(encode_trajectory(make())[:-7])
    with pytest.raises(CodecError, match="dtype"):
        obj = trajectory_to_obj(make())
        obj["segments"][0]["token_ids"] = obj["segments"][0]["token_ids"].astype(np.complex64)
        decode_trajectory(msgpack.packb(obj, default=_default))


@pytest.mark.parametrize("n", [1, 2, 3, 40, 12000])  # ext widths: fixext16 (3 bools), 8, 16, 32
@pytest.mark.parametrize("routing_dtype", [np.uint8, np.uint16, None])
def test_encoding_is_packb_of_the_object_byte_for_byte(n: int, routing_dtype) -> None:
    """encode_trajectory frames arrays itself (one copy): the bytes stay msgpack's own, ext sizes of every width."""
    from t1.trajectory.serialization import _default

    t = make(n, routing_dtype or np.uint8, seed=n)
    if routing_dtype is None:
        t = dataclasses.replace(t, segments=tuple(dataclasses.replace(s, routing=None) for s in t.segments))
    want = msgpack.packb(trajectory_to_obj(t), default=_default, use_bin_type=True)
    assert encode_trajectory(t) == want


def test_big_endian_and_strided_arrays_encode_as_before() -> None:
    from t1.trajectory.serialization import _default

    t = make(64)
    s = t.segments[0]
    odd = Segment(s.token_ids.astype(">i4"), s.logprobs, s.loss_mask, s.policy_versions,
                  np.asfortranarray(s.routing), s.turns)
    t = Trajectory(t.id, t.task_id, t.group_id, t.attempt, (odd,), t.reward, t.status)
    assert encode_trajectory(t) == msgpack.packb(trajectory_to_obj(t), default=_default, use_bin_type=True)
    back = decode_trajectory(encode_trajectory(t)).segments[0]
    assert back.token_ids.dtype == np.dtype("<i4") and np.array_equal(back.token_ids, s.token_ids)
    assert np.array_equal(back.routing, s.routing)


def test_pack_parts_joins_to_msgpack_of_the_same_list_without_copying_arrays():
    import msgpack

    from t1.trajectory.serialization import _default, pack_parts, unpack_obj

    routing = np.arange(20 * 48 * 8, dtype=np.uint8).reshape(20, 48, 8)  # 7,680 B: framed, not copied
    ids = np.arange(5, dtype=np.int32)  # small: copied into one part with its headers
    items = ["gen", {"start": 3, "ids": ids, "routing": routing, "routing_start": None,
                     "message": {"role": "assistant", "content": "ls"}, "messages": [{"role": "tool", "content": "x"}],
                     "commands": [["ls", 0], ["make", None]],
                     # arrays the journal's fast path must convert as _pack_array does: big-endian, strided, empty
                     "big": np.arange(4, dtype=">i4"), "strided": np.arange(12, dtype=np.int32)[::3],
                     "empty": np.zeros((0, 48, 8), np.uint8), "again": np.arange(3, dtype=">i4")}]
    parts = pack_parts(items)
    assert b"".join(parts) == msgpack.packb(items, default=_default, use_bin_type=True)
    assert any(isinstance(p, memoryview) and p.obj is routing for p in parts)  # the array's own buffer, not a copy
    assert not any(isinstance(p, memoryview) and p.obj is ids for p in parts)
    # a record without arrays is one part, packed in one call
    record = ["turn", {"turn": 3, "commands": [("ls", 0)], "observation": [{"role": "tool", "content": "x"}],
                       "tito": {"causes": {}, "synced": True}}]
    assert len(pack_parts(record)) == 3 and b"".join(pack_parts(record)) == msgpack.packb(record, use_bin_type=True)
    kind, fields = unpack_obj(b"".join(parts))
    assert (
        kind == "gen"
        and np.array_equal(fields["routing"], routing)
        and fields["commands"] == [["ls", 0], ["make", None]]
    )
