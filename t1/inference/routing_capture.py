"""Routing capture: forward hooks on a transformers MoE model's router modules record top-k expert ids.

The router classes are those of the MoE adapter table (t1.routing.adapters.ROUTER_ADAPTERS), shared
with routing replay; in transformers 5 each returns (router_logits, routing_weights,
selected_experts [tokens, top_k]) for the flattened tokens of the forward.
Legend: T = positions processed by one forward, L = MoE layers, K = experts per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from t1.routing.block import routing_dtype


@dataclass(frozen=True, slots=True)
class MoeShape:
    """What the routing of a model looks like."""

    num_layers: int
    num_experts: int
    top_k: int

    @property
    def dtype(self) -> np.dtype:
        return routing_dtype(self.num_experts)


def find_routers(model: nn.Module) -> list[nn.Module]:
    """The router modules in layer order (empty for a dense model)."""
    from t1.routing.adapters import ROUTER_ADAPTERS

    return [m for m in model.modules() if type(m).__name__ in ROUTER_ADAPTERS]


def moe_shape(model: nn.Module) -> MoeShape | None:
    routers = find_routers(model)
    if not routers:
        return None
    first: Any = routers[0]
    return MoeShape(num_layers=len(routers), num_experts=int(first.num_experts), top_k=int(first.top_k))


class RoutingRecorder:
    """Hooks every router; while a sink is set, each forward appends its [T, K] expert ids per layer to it.

    A request owns its sink (one list per layer) for all of its steps and converts it to numpy once
    at the end, so a decode step costs one list append per layer and no device sync; the ids stay
    on the model's device (a few bytes per position and layer) until that single copy to the host.
    """

    def __init__(self, model: nn.Module) -> None:
        self._routers = find_routers(model)
        self.shape = moe_shape(model)
        self.sink: list[list[torch.Tensor]] | None = None
        self._handles = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self._routers)]

    def _hook(self, layer: int):
        def hook(_module: nn.Module, _inputs: tuple, output: tuple) -> None:
            if self.sink is not None:
                self.sink[layer].append(output[2])
        return hook

    def new_sink(self) -> list[list[torch.Tensor]]:
        return [[] for _ in self._routers]

    def to_array(self, sink: list[list[torch.Tensor]]) -> np.ndarray | None:
        """[T, L, K] ids of every position recorded into sink, in order (None for a dense model)."""
        if self.shape is None:
            return None
        if not sink or not sink[0]:
            return np.zeros((0, self.shape.num_layers, self.shape.top_k), dtype=self.shape.dtype)
        # Joined on the model's device, then one device-to-host copy for the whole request.
        ids_TLK = torch.stack([torch.cat(chunks, dim=0) for chunks in sink], dim=1)
        return ids_TLK.cpu().numpy().astype(self.shape.dtype)

    def start(self) -> None:
        """Record into a fresh sink (for one-off forwards; requests pass their own sink)."""
        self.sink = self.new_sink()

    def stop(self) -> np.ndarray | None:
        """Stop recording and return what was recorded since start."""
        sink, self.sink = self.sink, None
        return self.to_array(sink or self.new_sink())

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
