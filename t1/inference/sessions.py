"""Per-session KV caches: an LRU bounded by memory, and the prefix match that decides what to prefill.

A session entry holds the exact ids whose keys and values are in its cache. A request takes its
session's entry out while it runs (so two requests never share one cache) and puts it back after.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(slots=True)
class SessionEntry:
    """A KV cache and the ids it covers, valid for one weight version."""

    ids: np.ndarray     # int32 [n]: the tokens whose KV is in `cache`
    cache: Any          # transformers Cache
    version: int
    nbytes: int


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two id arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def reusable_prefix(cached_ids: np.ndarray, prompt_ids: np.ndarray) -> int:
    """How many leading cached positions a prompt can reuse; at least one prompt token is always recomputed."""
    return min(common_prefix_len(cached_ids, prompt_ids), len(prompt_ids) - 1)


class SessionLRU:
    """Session id -> SessionEntry, evicting least recently used entries beyond max_bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, SessionEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def take(self, session_id: str, version: int) -> SessionEntry | None:
        """Remove and return the session's entry if it was built with this weight version."""
        entry = self._entries.pop(session_id, None)
        if entry is None or entry.version != version:
            return None
        return entry

    def put(self, session_id: str, entry: SessionEntry) -> None:
        if entry.nbytes > self.max_bytes:
            return
        self._entries[session_id] = entry
        self._entries.move_to_end(session_id)
        while self.nbytes > self.max_bytes:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
