"""The routing block: top-k expert ids per (position, MoE layer), packed as little-endian bytes.

A block covers positions `start .. start + tokens - 1` of a sequence. Its array has shape
[tokens, layers, top_k] and dtype uint8 when the model has at most 256 experts, else uint16.
A row whose every element has all bits set (the sentinel) marks a position whose routing is missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The wire names a routing block's dtype by name; looked up per block, so without building dtypes.
_WIRE_DTYPES: dict[str, np.dtype] = {"uint8": np.dtype("<u1"), "uint16": np.dtype("<u2")}


def routing_dtype(num_experts: int) -> np.dtype:
    """uint8 when the model has at most 256 experts, else uint16.

    A missing row is all top_k entries set to all-ones; with distinct ids per row (top_k >= 2)
    that can never be a real record, so id 255 stays usable in uint8.
    """
    if num_experts <= 0:
        raise ValueError(f"num_experts must be positive, got {num_experts}")
    if num_experts <= 256:
        return np.dtype("<u1")
    if num_experts <= 65536:
        return np.dtype("<u2")
    raise ValueError(f"num_experts {num_experts} does not fit uint16")


def sentinel(dtype: np.dtype) -> int:
    """The all-bits-set value of a routing dtype: marks a missing record."""
    return int(np.iinfo(dtype).max)


@dataclass(frozen=True, slots=True, eq=False)
class RoutingBlock:
    """Expert ids for positions start .. start + experts.shape[0] - 1."""

    start: int
    experts: np.ndarray  # [tokens, layers, top_k], uint8 or uint16

    @property
    def num_tokens(self) -> int:
        return int(self.experts.shape[0])

    @property
    def end(self) -> int:
        """One past the last position covered."""
        return self.start + self.num_tokens

    def missing_rows(self) -> np.ndarray:
        """Boolean [tokens, layers]: True where the record is the sentinel."""
        return (self.experts == sentinel(self.experts.dtype)).all(axis=-1)

    @classmethod
    def from_bytes(cls, start: int, data: bytes, shape: tuple[int, int, int], dtype: str) -> RoutingBlock:
        """A block from the raw little-endian bytes of its expert array (C order); checks that the byte count
        matches the shape."""
        dt = _WIRE_DTYPES.get(dtype)
        if dt is None:
            raise ValueError(f"routing dtype must be uint8 or uint16, got {dtype}")
        if len(shape) != 3 or any(int(s) < 0 for s in shape):
            raise ValueError(f"routing shape must be [tokens, layers, top_k], got {list(shape)}")
        expected = math.prod(shape) * dt.itemsize
        if len(data) != expected:
            raise ValueError(f"routing data has {len(data)} bytes, shape {list(shape)} x {dt} needs {expected}")
        if start < 0:
            raise ValueError(f"routing start must be >= 0, got {start}")
        arr = np.frombuffer(data, dtype=dt).reshape(shape)
        return cls(start=start, experts=arr)
