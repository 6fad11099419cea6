"""Validation of routed-expert arrays from an inference engine, before they become a RoutingBlock.

Engines have been seen to return arrays that are short (rows missing at the end), rows of all-zero
ids, rows with the same expert twice, ids out of range, or rows for the whole sequence when only
rows from `start` were asked for. Each bad (position, layer) record becomes the sentinel (missing),
so the trainer falls back to its live router there instead of replaying garbage, and is counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from t1.inference.routing_capture import MoeShape
from t1.routing.block import RoutingBlock, sentinel


@dataclass(frozen=True, slots=True)
class RouteDefects:
    """Counts of what was wrong in one engine array (records are (position, layer) pairs)."""

    malformed: bool = False         # wrong rank or [layers, top_k]: the whole array was dropped
    missing_rows: int = 0           # positions absent (array too short, or no array)
    extra_rows: int = 0             # rows beyond the expected count, dropped
    zero_records: int = 0           # all ids zero with top_k >= 2
    duplicate_records: int = 0      # an expert twice in one record
    out_of_range_records: int = 0   # an id < 0 or >= num_experts

    @property
    def any(self) -> bool:
        return bool(self.malformed or self.missing_rows or self.extra_rows or self.zero_records
                    or self.duplicate_records or self.out_of_range_records)


def check_routed_experts(array: np.ndarray | None, start: int, num_rows: int,
                         moe: MoeShape) -> tuple[RoutingBlock, RouteDefects]:
    """A RoutingBlock for positions start .. start + num_rows - 1 from an engine's [rows, layers, top_k] array.

    If the array has exactly start + num_rows rows the engine ignored the requested start, and the
    leading rows are dropped.
    """
    dtype = moe.dtype
    out = np.full((num_rows, moe.num_layers, moe.top_k), sentinel(dtype), dtype=dtype)
    if array is None:
        return RoutingBlock(start, out), RouteDefects(missing_rows=num_rows)
    arr = np.asarray(array)
    if arr.ndim != 3 or arr.shape[1:] != (moe.num_layers, moe.top_k) or not np.issubdtype(arr.dtype, np.integer):
        return RoutingBlock(start, out), RouteDefects(malformed=True, missing_rows=num_rows)
    if start > 0 and arr.shape[0] == start + num_rows:
        arr = arr[start:]
    extra = max(0, arr.shape[0] - num_rows)
    arr = arr[:num_rows].astype(np.int64)
    rows = arr.shape[0]
    out_of_range = ((arr < 0) | (arr >= moe.num_experts)).any(axis=-1)
    zero = (arr == 0).all(axis=-1) if moe.top_k >= 2 else np.zeros(arr.shape[:2], bool)
    ordered = np.sort(arr, axis=-1)
    duplicate = (np.diff(ordered, axis=-1) == 0).any(axis=-1) & ~zero
    bad = out_of_range | zero | duplicate
    good = arr.copy()
    good[bad] = sentinel(dtype)
    out[:rows] = good.astype(dtype)
    return RoutingBlock(start, out), RouteDefects(
        missing_rows=num_rows - rows, extra_rows=extra, zero_records=int(zero.sum()),
        duplicate_records=int(duplicate.sum()), out_of_range_records=int((out_of_range & ~zero).sum()),
    )
