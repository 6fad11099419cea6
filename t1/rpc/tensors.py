"""numpy arrays <-> t1.v1.Tensor (raw little-endian bytes with dtype and shape) and routing blocks."""

from __future__ import annotations

import functools
import math

import numpy as np

from t1.errors import BadRequest
from t1.routing.block import RoutingBlock
from t1.v1 import common_pb2

ALLOWED_DTYPES = frozenset({"int32", "int64", "float32", "float16", "bfloat16", "uint8", "uint16", "bool"})


@functools.cache
def _little_endian(name: str) -> np.dtype:
    return np.dtype(name).newbyteorder("<")


class TensorError(BadRequest, ValueError):
    """A Tensor message that does not describe a valid array; the message names the field."""


_NAMES: dict[np.dtype, str] = {}


def _dtype_name(dt: np.dtype) -> str:
    """`dt.name`, which numpy computes in Python on every access (microseconds), remembered per dtype."""
    name = _NAMES.get(dt)
    if name is None:
        name = _NAMES[dt] = dt.name
    return name


def to_tensor(array: np.ndarray) -> common_pb2.Tensor:
    arr = np.ascontiguousarray(array)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return common_pb2.Tensor(dtype=_dtype_name(arr.dtype), shape=list(arr.shape), data=arr.tobytes())


def from_tensor(msg: common_pb2.Tensor, field: str, *, dtype: str | None = None, ndim: int | None = None) -> np.ndarray:
    """Decode a Tensor; raises TensorError naming `field` on a bad dtype, shape or byte count."""
    if dtype is not None and msg.dtype != dtype:
        raise TensorError(f"{field}: dtype must be {dtype}, got {msg.dtype or '<empty>'!r}")
    if msg.dtype not in ALLOWED_DTYPES:
        raise TensorError(f"{field}: unsupported dtype {msg.dtype!r}")
    shape = tuple(int(s) for s in msg.shape)
    if ndim is not None and len(shape) != ndim:
        raise TensorError(f"{field}: expected {ndim} dimensions, got shape {list(shape)}")
    if any(s < 0 for s in shape):
        raise TensorError(f"{field}: negative dimension in shape {list(shape)}")
    dt = _little_endian(msg.dtype)
    expected = math.prod(shape) * dt.itemsize
    if len(msg.data) != expected:
        raise TensorError(f"{field}: {len(msg.data)} bytes do not match shape {list(shape)} of {msg.dtype}")
    return np.frombuffer(msg.data, dtype=dt).reshape(shape)


def routing_to_proto(block: RoutingBlock) -> common_pb2.RoutingBlock:
    return common_pb2.RoutingBlock(start=block.start, experts=to_tensor(block.experts))


def routing_from_proto(msg: common_pb2.RoutingBlock, field: str = "routing") -> RoutingBlock | None:
    """None when the message carries no routing (dense model or routing not requested)."""
    if not msg.HasField("experts"):
        return None
    try:
        return RoutingBlock.from_bytes(msg.start, msg.experts.data, tuple(msg.experts.shape), msg.experts.dtype)  # type: ignore[arg-type]
    except ValueError as exc:
        raise TensorError(f"{field}: {exc}") from None
