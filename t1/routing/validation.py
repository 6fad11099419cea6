"""Validation of routing arrays: shape, expert-id range, distinct ids per row, all-zero rows.

A routing array is [tokens, layers, top_k] of uint8/uint16 with sentinel rows (all bits set) where
the record is missing. Hard faults raise RoutingError naming what was wrong; soft findings (missing
rows, all-zero rows, which a broken capture produces) come back in a RoutingReport for the caller
to count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from t1.errors import DataError
from t1.routing.block import sentinel


class RoutingError(DataError, ValueError):
    """A routing record that cannot be replayed: wrong shape, dtype, range or duplicate experts."""


@dataclass(frozen=True, slots=True)
class RoutingReport:
    """What validation found in a routing array (counts are over (token, layer) rows)."""

    rows: int
    missing_rows: int
    all_zero_rows: int

    @property
    def coverage(self) -> float:
        """Share of rows with a record (1.0 for an empty array)."""
        return 1.0 if self.rows == 0 else (self.rows - self.missing_rows) / self.rows


def validate_routing(
    experts: np.ndarray,
    *,
    num_layers: int | None = None,
    top_k: int | None = None,
    num_experts: int | None = None,
    num_tokens: int | None = None,
) -> RoutingReport:
    """Check a routing array; raise RoutingError on a hard fault, else report soft findings.

    Each given expectation (num_layers, top_k, num_experts, num_tokens) is checked; ids must be
    below num_experts and distinct within a row, except on sentinel rows.
    """
    if not isinstance(experts, np.ndarray):
        raise RoutingError(f"routing must be a numpy array, got {type(experts).__name__}")
    if experts.dtype not in (np.dtype("uint8"), np.dtype("uint16")):
        raise RoutingError(f"routing dtype must be uint8 or uint16, got {experts.dtype}")
    if experts.ndim != 3:
        raise RoutingError(f"routing must be [tokens, layers, top_k], got shape {list(experts.shape)}")
    n, layers, k = (int(s) for s in experts.shape)
    for name, want, got in (("tokens", num_tokens, n), ("layers", num_layers, layers), ("top_k", top_k, k)):
        if want is not None and want != got:
            raise RoutingError(f"routing has {got} {name}, expected {want} (shape {list(experts.shape)})")
    if k == 0 or layers == 0:
        raise RoutingError(f"routing shape {list(experts.shape)} has an empty layer or top_k axis")
    missing = (experts == sentinel(experts.dtype)).all(axis=-1)
    present = experts[~missing]  # [rows, top_k]
    if num_experts is not None and present.size and int(present.max()) >= num_experts:
        bad = np.argwhere((experts >= num_experts).any(axis=-1) & ~missing)[0]
        raise RoutingError(
            f"routing expert id {int(experts[tuple(bad)].max())} at token {bad[0]} layer {bad[1]} "
            f"is out of range for {num_experts} experts")
    if k > 1 and present.size:
        srt = np.sort(present, axis=-1)
        dup = (srt[:, 1:] == srt[:, :-1]).any(axis=-1)
        all_zero = (present == 0).all(axis=-1)
        dup_not_zero = dup & ~all_zero
        if dup_not_zero.any():
            idx = np.argwhere(~missing)[np.argmax(dup_not_zero)]
            raise RoutingError(
                f"routing row at token {idx[0]} layer {idx[1]} repeats an expert: "
                f"{experts[idx[0], idx[1]].tolist()}")
        num_zero = int(all_zero.sum())
    else:
        num_zero = int((present == 0).all(axis=-1).sum()) if present.size else 0
    return RoutingReport(rows=n * layers, missing_rows=int(missing.sum()), all_zero_rows=num_zero)
