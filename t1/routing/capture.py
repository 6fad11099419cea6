"""Capture of the experts a model's routers select, per forward call, as routing arrays.

Hooks every router (see adapters.find_routers) and records the top-k index it outputs, after any
replay hook registered earlier, so it shows what the experts actually computed. Used by the
reference decoding in tests and benches and to check replay; positions are the flattened tokens of
each call, so with batch 1 the calls concatenate into a sequence's routing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from t1.routing.adapters import find_routers
from t1.routing.block import routing_dtype


class RoutingCapture:
    """Per forward call, the selected experts of every MoE layer: [tokens, layers, top_k] arrays."""

    def __init__(self, num_layers: int, num_experts: int) -> None:
        self.num_layers = num_layers
        self.dtype = routing_dtype(num_experts)
        self._pending: dict[int, np.ndarray] = {}
        self.calls: list[np.ndarray] = []
        self.backward_calls: list[np.ndarray] = []

    def _record(self, layer: int, index_NK: torch.Tensor) -> None:
        self._pending[layer] = index_NK.detach().to("cpu", torch.int64).numpy().astype(self.dtype)
        if len(self._pending) == self.num_layers:
            call = np.stack([self._pending[i] for i in range(self.num_layers)], axis=1)
            in_backward = torch._C._current_graph_task_id() != -1
            (self.backward_calls if in_backward else self.calls).append(call)
            self._pending = {}

    def concatenated(self) -> np.ndarray:
        """All forward calls joined along tokens (a sequence's routing under batch-1 decoding)."""
        if not self.calls:
            raise ValueError("no forward call was captured")
        return np.concatenate(self.calls, axis=0)


@contextmanager
def capture_routing(model: nn.Module) -> Iterator[RoutingCapture]:
    """Record the routers' selected experts for every forward call inside the block."""
    routers = find_routers(model)
    cap = RoutingCapture(len(routers), routers[0].num_experts)
    handles = []
    for r in routers:
        def hook(module: nn.Module, args: tuple, output: tuple, layer: int = r.layer) -> None:
            cap._record(layer, output[2])
        handles.append(r.module.register_forward_hook(hook))
    try:
        yield cap
    finally:
        for h in handles:
            h.remove()
