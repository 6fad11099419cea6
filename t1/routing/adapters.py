"""The MoE router adapter table: how to find each family's routers and recompute their gate weights.

In transformers 5.x every supported family routes through a router module whose forward returns
(router_logits [N, E], top_k_weights [N, K], top_k_index [N, K]) for the flattened tokens of the
batch. Replay keeps the logits (so the router's parameters stay in the graph), swaps the index for
the recorded one, and recomputes the weights with the family's own gate function below.
Adding a family = one table entry keyed by the router's class name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

GateFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def softmax_gate(module: nn.Module, logits_NE: torch.Tensor, index_NK: torch.Tensor) -> torch.Tensor:
    """Qwen2/3-MoE, OLMoE: softmax in float32, gather, renormalise if norm_topk_prob, cast to logits' dtype."""
    probs_NE = torch.softmax(logits_NE, dim=-1, dtype=torch.float)
    w_NK = probs_NE.gather(1, index_NK)
    if getattr(module, "norm_topk_prob", False):
        w_NK = w_NK / w_NK.sum(dim=-1, keepdim=True)
    return w_NK.to(logits_NE.dtype)


def mixtral_gate(module: nn.Module, logits_NE: torch.Tensor, index_NK: torch.Tensor) -> torch.Tensor:
    """Mixtral: softmax in float32, gather, always renormalised, left in float32."""
    w_NK = torch.softmax(logits_NE.float(), dim=-1).gather(1, index_NK)
    return w_NK / w_NK.sum(dim=-1, keepdim=True)


def deepseek_v3_gate(module: nn.Module, logits_NE: torch.Tensor, index_NK: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3 style: sigmoid scores (the selection bias is not part of the weight), gather,
    optional renormalisation, routed scaling factor."""
    w_NK = logits_NE.sigmoid().gather(1, index_NK)
    if getattr(module, "norm_topk_prob", False):
        w_NK = w_NK / (w_NK.sum(dim=-1, keepdim=True) + 1e-20)
    return w_NK * float(cast(Any, module).routed_scaling_factor)


@dataclass(frozen=True, slots=True)
class RouterAdapter:
    """One MoE family: its gate-weight function; the router module carries top_k and num_experts."""

    family: str
    gate: GateFn


ROUTER_ADAPTERS: dict[str, RouterAdapter] = {
    "Qwen3MoeTopKRouter": RouterAdapter("qwen3_moe", softmax_gate),
    "Qwen2MoeTopKRouter": RouterAdapter("qwen2_moe", softmax_gate),
    "OlmoeTopKRouter": RouterAdapter("olmoe", softmax_gate),
    "MixtralTopKRouter": RouterAdapter("mixtral", mixtral_gate),
    "DeepseekV3TopkRouter": RouterAdapter("deepseek_v3", deepseek_v3_gate),
}


@dataclass(frozen=True, slots=True, eq=False)
class MoERouter:
    """A router found in a model: its MoE-layer ordinal (the routing array's layer axis), name and adapter."""

    layer: int
    name: str
    module: nn.Module
    adapter: RouterAdapter

    @property
    def top_k(self) -> int:
        return int(cast(Any, self.module).top_k)

    @property
    def num_experts(self) -> int:
        return int(cast(Any, self.module).num_experts)


def find_routers(model: nn.Module) -> list[MoERouter]:
    """The model's MoE routers in module order; layer i of a routing array belongs to the i-th one.

    Raises ValueError when the model has none of the known router classes.
    """
    found = [(name, m, ROUTER_ADAPTERS[type(m).__name__]) for name, m in model.named_modules()
             if type(m).__name__ in ROUTER_ADAPTERS]
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no MoE router of a known family; known router classes: "
            f"{sorted(ROUTER_ADAPTERS)}")
    return [MoERouter(layer=i, name=n, module=m, adapter=a) for i, (n, m, a) in enumerate(found)]
