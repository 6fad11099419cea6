"""Rebuild a journaled TokenBuffer's segments from its record: the BufferSink events, in order.

    segment {ids, messages, shared}   a new full SegmentBuilder starting with ids; its first `shared`
                                      positions take the previous segment's routing
    gen     {start, ids, logprobs, versions, routing_start, routing, message, repair}
    ctx     {ids, messages}

The replay is the buffer's own appends again, so the built segments equal what an unjournaled
buffer would have exported, array for array. Events of other kinds (the episode's own: turns,
its end) are skipped. A record that does not fit (a generation at a position the segment does not
have, events before the first segment) raises JournalMismatch: it was not written by this buffer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from t1.errors import DataError
from t1.routing.block import RoutingBlock
from t1.tito.segment import SegmentBuilder

BUFFER_EVENTS = frozenset({"segment", "gen", "ctx"})


class JournalMismatch(DataError, ValueError):
    """An episode's record does not replay into a buffer: damaged, or not this buffer's."""


@dataclass(slots=True)
class Replayed:
    """Full builders of every segment, and the sampler's record: (segment index, start, sampled ids)."""

    builders: list[SegmentBuilder] = field(default_factory=list)
    sampled: list[tuple[int, int, np.ndarray]] = field(default_factory=list)


def replay(events: Iterable[tuple[str, Mapping[str, Any]]]) -> Replayed:
    out = Replayed()
    for i, (kind, f) in enumerate(events):
        if kind not in BUFFER_EVENTS:
            continue
        if kind == "segment":
            b = SegmentBuilder()
            b.append_context(np.asarray(f["ids"], np.int32))
            shared = int(f["shared"])
            if shared and out.builders:
                block = out.builders[-1].routing_prefix(shared)
                if block is not None:
                    b.add_routing(block)
            out.builders.append(b)
            continue
        if not out.builders:
            raise JournalMismatch(f"event {i} ({kind}) comes before the first segment")
        b = out.builders[-1]
        if kind == "ctx":
            b.append_context(np.asarray(f["ids"], np.int32))
            continue
        if int(f["start"]) != len(b):
            raise JournalMismatch(f"event {i}: a generation at position {f['start']}, the segment has {len(b)} tokens")
        ids = np.asarray(f["ids"], np.int32)
        b.append_sampled(ids, f["logprobs"], f["versions"])
        if f["routing"] is not None:
            b.add_routing(RoutingBlock(int(f["routing_start"]), f["routing"]))
        if len(f["repair"]):
            b.append_context(np.asarray(f["repair"], np.int32))
        out.sampled.append((len(out.builders) - 1, int(f["start"]), ids))
    return out
