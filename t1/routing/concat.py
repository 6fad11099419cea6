"""Concatenation of routing blocks across turns into one array aligned with a segment's positions.

Each generate call returns a RoutingBlock for the positions it processed for the first time; a
segment's routing is those blocks laid out at their start positions, sentinel rows where no block
covered a position (the last token, and any prefix the server never reported). When a server
re-processed positions (prefix cache evicted), the later block wins: its routing produced the KV
the later tokens were sampled against.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from t1.routing.block import RoutingBlock, sentinel
from t1.routing.validation import RoutingError


def empty_routing(num_tokens: int, num_layers: int, top_k: int, dtype: np.dtype) -> np.ndarray:
    """An all-sentinel routing array [num_tokens, num_layers, top_k]."""
    return np.full((num_tokens, num_layers, top_k), sentinel(np.dtype(dtype)), dtype=dtype)


def concat_blocks(blocks: Sequence[RoutingBlock], num_tokens: int) -> tuple[np.ndarray | None, int]:
    """Lay blocks out over positions 0..num_tokens-1; returns (array or None if no blocks, overlap rows).

    All blocks must share layers, top_k and dtype, and lie within num_tokens.
    """
    if not blocks:
        return None, 0
    first = blocks[0].experts
    _, layers, k = first.shape
    out = empty_routing(num_tokens, layers, k, first.dtype)
    covered = np.zeros(num_tokens, dtype=bool)
    overlap = 0
    for i, b in enumerate(blocks):
        e = b.experts
        if e.ndim != 3 or e.shape[1:] != (layers, k) or e.dtype != first.dtype:
            raise RoutingError(
                f"routing block {i} has shape {list(e.shape)} {e.dtype}, the first had "
                f"[*, {layers}, {k}] {first.dtype}")
        if b.start < 0 or b.end > num_tokens:
            raise RoutingError(
                f"routing block {i} covers positions {b.start}..{b.end - 1}, outside 0..{num_tokens - 1}")
        overlap += int(covered[b.start:b.end].sum())
        covered[b.start:b.end] = True
        out[b.start:b.end] = e
    return out, overlap


def concat_arrays(arrays: Iterable[np.ndarray]) -> np.ndarray:
    """Concatenate routing arrays along tokens (packing segments); all must share layers/top_k/dtype."""
    arrs = list(arrays)
    if not arrs:
        raise RoutingError("no routing arrays to concatenate")
    ref = arrs[0]
    for i, a in enumerate(arrs):
        if a.ndim != 3 or a.shape[1:] != ref.shape[1:] or a.dtype != ref.dtype:
            raise RoutingError(
                f"routing array {i} has shape {list(a.shape)} {a.dtype}, the first has "
                f"[*, {ref.shape[1]}, {ref.shape[2]}] {ref.dtype}")
    return np.concatenate(arrs, axis=0)
