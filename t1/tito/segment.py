"""One exact-token segment under construction: ids, logprobs, loss mask, versions, routing, turns.

Appends are chunks of numpy arrays; the ids also go into one growing int32 array (capacity doubles),
so prompt_ids() is a read-only view, not a per-turn copy of the whole context. Routing
blocks are kept as returned by the server and laid out over positions at export (sentinel rows
where no block covered a position).

A lean builder (`keep_arrays=False`, a journaled episode) keeps only the ids and counts: its logprobs,
versions, mask and routing are on disk in the episode's journal, and the segment is built by
replaying the journal into a full builder (t1/tito/replay.py).
"""

from __future__ import annotations

import numpy as np

from t1.routing.block import RoutingBlock
from t1.routing.concat import concat_blocks
from t1.trajectory.types import Segment, TurnSpan


class SegmentBuilder:
    """Accumulates one segment; every array stays aligned by position."""

    def __init__(self, keep_arrays: bool = True) -> None:
        self.keep_arrays = keep_arrays
        self._num_turns = 0
        self._logprobs: list[np.ndarray] = []
        self._mask: list[np.ndarray] = []
        self._versions: list[np.ndarray] = []
        self._blocks: list[RoutingBlock] = []
        self._turns: list[TurnSpan] = []
        self._len = 0
        self._flat = np.zeros(1024, np.int32)  # ids[:_len] valid; grown by doubling
        self._view: np.ndarray | None = None   # ids() until the next append (a turn asks several times)

    def __len__(self) -> int:
        return self._len

    def ids(self) -> np.ndarray:
        """All ids so far: a read-only int32 view (later appends write past its end, never into it)."""
        view = self._view
        if view is None:
            view = self._view = self._flat[:min(self._len, len(self._flat))]
            view.flags.writeable = False
        return view

    def drop_ids(self) -> None:
        """A closed lean builder lets its ids go (they are in the journal); it keeps its length and turn count."""
        if self.keep_arrays:
            raise RuntimeError("only a lean builder's record lives elsewhere")
        self._flat = np.zeros(0, np.int32)
        self._view = None

    def append_context(self, ids: np.ndarray) -> None:
        """Tokens the sampler consumes but did not produce: loss mask off, no logprob, version -1."""
        n = len(ids)
        self._push(np.asarray(ids, np.int32), np.full(n, np.nan, np.float32), np.zeros(n, bool),
                   np.full(n, -1, np.int32))

    def append_sampled(self, ids: np.ndarray, logprobs: np.ndarray, versions: np.ndarray) -> TurnSpan:
        """Sampled tokens: loss mask on; returns their span as a turn."""
        ids = np.asarray(ids, np.int32)
        if not (len(ids) == len(logprobs) == len(versions)):
            raise ValueError(f"sampled ids ({len(ids)}), logprobs ({len(logprobs)}) and versions "
                             f"({len(versions)}) differ in length")
        start = self._len
        self._push(ids, np.asarray(logprobs, np.float32), np.ones(len(ids), bool), np.asarray(versions, np.int32))
        span = TurnSpan(start, self._len)
        self._num_turns += 1
        if self.keep_arrays:
            self._turns.append(span)
        return span

    def add_routing(self, block: RoutingBlock) -> None:
        if block.start < 0 or block.end > self._len:
            raise ValueError(f"routing block covers positions {block.start}..{block.end - 1}, the segment "
                             f"has {self._len} tokens")
        if self.keep_arrays:
            self._blocks.append(block)

    def routing_prefix(self, n: int) -> RoutingBlock | None:
        """Routing of positions 0..n-1 as one block (sentinel where missing), None without routing."""
        routing, _ = concat_blocks(self._blocks, self._len)
        return None if routing is None or n <= 0 else RoutingBlock(0, routing[:n].copy())

    def _push(self, ids: np.ndarray, lp: np.ndarray, mask: np.ndarray, ver: np.ndarray) -> None:
        if self.keep_arrays:
            self._logprobs.append(lp)
            self._mask.append(mask)
            self._versions.append(ver)
        end = self._len + len(ids)
        if end > len(self._flat):
            grown = np.zeros(max(end, 2 * len(self._flat)), np.int32)
            grown[:self._len] = self._flat[:self._len]
            self._flat = grown
        self._flat[self._len:end] = ids
        self._len = end
        self._view = None

    def build(self, turn_rewards: dict[int, float] | None = None, first_turn: int = 0) -> Segment:
        """The finished Segment, ending at its last sampled token: context after it (a repair, an
        observation) was never consumed by the sampler, so the trainer does not see it.
        turn_rewards is keyed by episode-wide turn index (first_turn = this segment's first)."""
        if not self.keep_arrays:
            raise RuntimeError("a lean segment builder keeps no arrays: build it from the episode's journal")
        rewards = turn_rewards or {}
        n = self._turns[-1].end if self._turns else self._len
        routing, _ = concat_blocks(self._blocks, self._len)

        def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
            return (np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype))[:n]

        return Segment(
            token_ids=self.ids()[:n].copy(), logprobs=cat(self._logprobs, np.float32), loss_mask=cat(self._mask, bool),
            policy_versions=cat(self._versions, np.int32), routing=None if routing is None else routing[:n],
            turns=tuple(TurnSpan(t.start, t.end, rewards.get(first_turn + i, 0.0)) for i, t in enumerate(self._turns)),
        )

    @property
    def num_turns(self) -> int:
        return self._num_turns
