"""A journaled TokenBuffer: its sink's record replays into the same segments, and it keeps no trajectory arrays."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
from test_buffer import OPENING, renderer_for

from t1.inference.types import FinishReason, GenerateResult
from t1.routing.block import RoutingBlock
from t1.tito.buffer import MismatchPolicy, TokenBuffer, build_segments
from t1.tito.render import ChatRenderer
from t1.tito.replay import JournalMismatch, replay
from t1.trajectory.serialization import pack_parts, unpack_obj

LAYERS, TOP_K = 48, 8


class ListSink:
    """The BufferSink contract kept in a list, through the journal's own frame codec (pack_parts)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def _keep(self, kind: str, fields: dict[str, Any]) -> None:
        self.events.append(tuple(unpack_obj(b"".join(pack_parts([kind, fields])))))  # type: ignore[arg-type]

    def segment(self, ids, messages, shared_prefix) -> None:
        self._keep("segment", {"ids": ids, "messages": list(messages), "shared": shared_prefix})

    def generation(self, start, ids, logprobs, versions, routing, message, repair, summary=False) -> None:
        self._keep("gen", {"start": start, "ids": ids, "logprobs": logprobs, "versions": versions,
                           "routing_start": None if routing is None else routing.start,
                           "routing": None if routing is None else routing.experts, "message": message,
                           "repair": repair, **({"summary": True} if summary else {})})

    def context(self, ids, messages) -> None:
        self._keep("ctx", {"ids": ids, "messages": list(messages)})


def routed(r: ChatRenderer, text: str, prompt_len: int, version: int, rng: np.random.Generator,
           stop: bool = True) -> GenerateResult:
    """A generation with logprobs, per-token versions and 48 x 8 routing for the positions it processed."""
    ids = r.encode(text) + (list(r.end_of_turn_ids) if stop else [])
    n = len(ids)
    return GenerateResult(
        token_ids=np.asarray(ids, np.int32), logprobs=rng.normal(-1, 0.3, n).astype(np.float32),
        finish_reason=FinishReason.STOP if stop else FinishReason.LENGTH, policy_version=version,
        token_versions=np.full(n, version, np.int32), prompt_tokens=prompt_len,
        routing=RoutingBlock(max(0, prompt_len - 60), rng.integers(0, 128, (n + min(60, prompt_len) - 1, LAYERS, TOP_K),
                                                                   dtype=np.uint8)))


def play(buf: TokenBuffer, r: ChatRenderer, turns: int) -> None:
    """Turns with everything a buffer meets: a cut-off reply (repair), stripped reasoning (a NEW_SEGMENT
    mismatch), a compaction that shares a prefix with the segment before it."""
    rng = np.random.default_rng(7)
    for i in range(turns):
        text = "<think>\nhmm\n</think>\n\nls" if i == 10 else f"echo {i} " * 6
        buf.append_generation(routed(r, text, len(buf.prompt_ids()), i // 4, rng, stop=i != 3))
        buf.append_observation([{"role": "user", "content": f"output {i} " * 8}])
        if i == 20:
            buf.compact([*OPENING, {"role": "user", "content": "Summary so far."}])


def test_the_journal_replays_into_the_segments_an_unjournaled_buffer_exports() -> None:
    r = renderer_for("chatml")
    plain = TokenBuffer(r, OPENING, on_mismatch=MismatchPolicy.NEW_SEGMENT)
    sink = ListSink()
    lean = TokenBuffer(r, OPENING, on_mismatch=MismatchPolicy.NEW_SEGMENT, sink=sink)
    play(plain, r, 30)
    play(lean, r, 30)
    assert plain.num_segments == lean.num_segments == 3
    assert np.array_equal(plain.prompt_ids(), lean.prompt_ids()) and plain.counters == lean.counters
    rewards = {2: 0.5, 25: -1.0}
    want = plain.segments(rewards)
    got = build_segments(replay(sink.events).builders, rewards)
    assert len(got) == len(want) == 3
    for a, b in zip(want, got, strict=True):
        for name in ("token_ids", "logprobs", "loss_mask", "policy_versions", "routing"):
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=name == "logprobs"), name
        assert a.turns == b.turns
    # The compacted segment's shared prefix carries the previous segment's routing, not sentinels.
    shared = [f["shared"] for k, f in sink.events if k == "segment"][-1]
    assert shared > 10 and got[2].routing is not None and (got[2].routing[:10] != 255).all()
    assert np.array_equal(got[2].routing[:10], got[1].routing[:10])  # later blocks overwrite the rest
    traj = lean.export(id="e", task_id="t", group_id="g", attempt=0, reward=1.0, status="ok",
                       replayed=replay(sink.events).builders)
    assert traj.num_tokens == sum(s.num_tokens for s in want)


def test_a_journaled_buffer_needs_its_journal_to_export() -> None:
    r = renderer_for("chatml")
    buf = TokenBuffer(r, OPENING, sink=ListSink())
    play(buf, r, 2)
    try:
        buf.export(id="e", task_id="t", group_id="g", attempt=0, reward=0.0, status="ok")
    except ValueError as exc:
        assert "journal" in str(exc)
    else:
        raise AssertionError("a journaled buffer exported without its journal")


def test_a_record_that_is_not_this_buffers_does_not_replay() -> None:
    r = renderer_for("chatml")
    sink = ListSink()
    play(TokenBuffer(r, OPENING, sink=sink), r, 3)
    ctx = next(i for i, (k, _) in enumerate(sink.events) if k == "ctx")
    damaged = sink.events[:ctx] + sink.events[ctx + 1:]  # an observation lost: the next generation is misplaced
    try:
        replay(damaged)
    except JournalMismatch as exc:
        assert "position" in str(exc)
    else:
        raise AssertionError("a record with a lost observation replayed")
    try:
        replay(sink.events[1:])
    except JournalMismatch as exc:
        assert "before the first segment" in str(exc)
    else:
        raise AssertionError("a record without its first segment replayed")


def _held_bytes(sink: ListSink | None, turns: int) -> int:
    r = renderer_for("chatml")
    tracemalloc.start()
    try:
        buf = TokenBuffer(r, OPENING, on_mismatch=MismatchPolicy.NEW_SEGMENT, sink=sink)
        if sink is not None:
            sink.events.clear()
            sink._keep = lambda kind, fields: None  # type: ignore[method-assign]  # the journal holds it, on disk
        base = tracemalloc.get_traced_memory()[0]
        play(buf, r, turns)
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert buf.num_segments == 3
    return held


def test_a_journaled_buffer_holds_ids_and_text_but_no_trajectory_arrays() -> None:
    """48 x 8 routing is 384 B a token: unjournaled, 40 turns of ~30 tokens hold ~0.5 MB; journaled, the buffer
    keeps the ids, decoded text and messages only (tens of bytes a token)."""
    plain, lean = _held_bytes(None, 40), _held_bytes(ListSink(), 40)
    assert plain > 400_000
    assert lean < plain / 8, (plain, lean)
