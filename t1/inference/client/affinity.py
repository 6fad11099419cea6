"""Session affinity of an inference pool: the replica a session sticks to, and where a new one goes.

A session stays on the replica that served it while that replica is healthy (its cache holds the
session's prefix there); a new session, or one whose replica is avoided, goes to the healthy replica
with the fewest outstanding requests; when every replica is avoided, to the one that failed longest
ago. The map is an LRU bounded by `max_entries` (sessions that never end are forgotten, oldest first).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

MAX_AFFINITY_ENTRIES = 100_000


class Replica(Protocol):
    outstanding: int
    unhealthy_until: float

    def healthy(self, now: float) -> bool: ...


class Affinity:
    """session id -> replica index."""

    def __init__(self, max_entries: int = MAX_AFFINITY_ENTRIES) -> None:
        self._map: OrderedDict[str, int] = OrderedDict()
        self._max = max_entries

    def get(self, session_id: str) -> int | None:
        return self._map.get(session_id)

    def pick(self, session_id: str, replicas: Sequence[Replica]) -> int:
        now = time.monotonic()
        idx = self._map.get(session_id) if session_id else None
        if idx is not None and replicas[idx].healthy(now):
            return idx
        healthy = [i for i, r in enumerate(replicas) if r.healthy(now)]
        if not healthy:  # all avoided: try the one that failed longest ago
            return min(range(len(replicas)), key=lambda i: replicas[i].unhealthy_until)
        return min(healthy, key=lambda i: (replicas[i].outstanding, i))

    def bind(self, session_id: str, idx: int) -> int | None:
        """Stick the session to `idx`; returns the replica it moved from (None when it did not move)."""
        if not session_id:
            return None
        previous = self._map.get(session_id)
        self._map[session_id] = idx
        self._map.move_to_end(session_id)
        while len(self._map) > self._max:
            self._map.popitem(last=False)
        return previous if previous is not None and previous != idx else None

    def forget(self, session_id: str) -> None:
        self._map.pop(session_id, None)
