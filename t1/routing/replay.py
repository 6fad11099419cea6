"""Routing replay (R3) in the trainer's forward: recorded experts, live gate weights.

`replay_routing(model, routing_BSLK)` hooks every MoE router (adapters.find_routers). For each
router call the hook takes the router's own logits, replaces the selected top-k index with the
recorded one and recomputes the gate weights from those logits with the family's gate function
(softmax gathered at the recorded experts, renormalised when the model normalises top-k), so the
router's parameters keep their gradient. The selection depends only on the recorded tensor, so a
checkpointed layer recomputed in backward selects the same experts. Rows marked missing (sentinel,
or -1 in signed tensors) and padding rows fall back to the live router; they are counted.

Legend: B batch, S sequence, L MoE layers, K top_k, N = B*S flattened tokens, E experts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from prometheus_client import Gauge
from torch import nn

from t1.routing.adapters import MoERouter, find_routers
from t1.routing.block import sentinel

REPLAY_COVERAGE = Gauge(
    "t1_routing_replay_coverage", "Share of (token, MoE layer) rows replayed from a record in the last step")
ROUTER_DISAGREEMENT = Gauge(
    "t1_router_disagreement_rate", "Share of recorded experts the trainer's live router would not have chosen")


class ReplayStats:
    """Counts over the forward calls inside one replay block (recomputation in backward excluded).

    Counts accumulate as device tensors (no host sync per layer) and are read on access.
    """

    def __init__(self) -> None:
        self._counts: torch.Tensor | None = None  # [replayed, fallback, compared, disagreeing]
        self.router_calls = 0

    def _add(self, counts: torch.Tensor) -> None:
        self._counts = counts if self._counts is None else self._counts + counts
        self.router_calls += 1

    def _get(self, i: int) -> int:
        return 0 if self._counts is None else int(self._counts[i])

    @property
    def replayed_rows(self) -> int:
        """(token, layer) rows that used the recorded experts."""
        return self._get(0)

    @property
    def fallback_rows(self) -> int:
        """Rows without a record that used the live router (padding excluded)."""
        return self._get(1)

    @property
    def compared_slots(self) -> int:
        """Recorded expert slots compared with the live top-k."""
        return self._get(2)

    @property
    def disagreeing_slots(self) -> int:
        """Recorded experts not in the live top-k."""
        return self._get(3)

    @property
    def coverage(self) -> float:
        total = self.replayed_rows + self.fallback_rows
        return 1.0 if total == 0 else self.replayed_rows / total

    @property
    def disagreement_rate(self) -> float:
        compared = self.compared_slots
        return 0.0 if compared == 0 else self.disagreeing_slots / compared

    def __repr__(self) -> str:
        return (f"ReplayStats(replayed_rows={self.replayed_rows}, fallback_rows={self.fallback_rows}, "
                f"compared_slots={self.compared_slots}, disagreeing_slots={self.disagreeing_slots}, "
                f"router_calls={self.router_calls})")


def routing_to_tensors(routing_BSLK: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index_BSLK int64 with missing rows zeroed, missing_BSL bool) from a recorded routing array.

    uint8/uint16 arrays mark missing rows with the sentinel (all bits set); signed integer tensors
    mark them with -1.
    """
    if isinstance(routing_BSLK, np.ndarray):
        if routing_BSLK.dtype not in (np.uint8, np.uint16):
            raise ValueError(f"routing array dtype must be uint8 or uint16, got {routing_BSLK.dtype}")
        missing = (routing_BSLK == sentinel(routing_BSLK.dtype)).all(axis=-1)
        index = torch.from_numpy(routing_BSLK.astype(np.int64))
        missing_t = torch.from_numpy(missing)
    elif isinstance(routing_BSLK, torch.Tensor):
        if routing_BSLK.dtype == torch.uint8:
            missing_t = (routing_BSLK == 255).all(dim=-1)
        elif routing_BSLK.dtype in (torch.int16, torch.int32, torch.int64):
            missing_t = (routing_BSLK < 0).all(dim=-1)
        else:
            raise ValueError(f"routing tensor dtype must be uint8 or signed int, got {routing_BSLK.dtype}")
        index = routing_BSLK.to(torch.int64)
    else:
        raise ValueError(f"routing must be a numpy array or torch tensor, got {type(routing_BSLK).__name__}")
    if index.ndim != 4:
        raise ValueError(f"routing must be [batch, seq, layers, top_k], got shape {list(index.shape)}")
    index = index.masked_fill(missing_t.unsqueeze(-1), 0)
    return index, missing_t


class _Replayer:
    """Holds the flattened record and the stats; one hook per router calls into it."""

    def __init__(self, index_BSLK: torch.Tensor, missing_BSL: torch.Tensor, pad_BS: torch.Tensor | None) -> None:
        b, s, layers, k = index_BSLK.shape
        self.index_NLK = index_BSLK.reshape(b * s, layers, k)
        self.missing_NL = missing_BSL.reshape(b * s, layers)
        self.pad_N = None if pad_BS is None else pad_BS.reshape(b * s)
        if self.pad_N is not None:
            self.missing_NL = self.missing_NL | self.pad_N[:, None]
        self.stats = ReplayStats()
        self._on_device = False

    def _to(self, device: torch.device) -> None:
        if not self._on_device:
            self.index_NLK = self.index_NLK.to(device)
            self.missing_NL = self.missing_NL.to(device)
            if self.pad_N is not None:
                self.pad_N = self.pad_N.to(device)
            self._on_device = True

    def hook(self, router: MoERouter, output: tuple) -> tuple:
        logits_NE, _, live_NK = output[0], output[1], output[2]
        n = logits_NE.shape[0]
        if n != self.index_NLK.shape[0]:
            raise ValueError(
                f"routing covers {self.index_NLK.shape[0]} tokens (batch*seq) but MoE layer {router.layer} "
                f"({router.name}) routed {n}; pass routing shaped like input_ids")
        self._to(logits_NE.device)
        missing_N = self.missing_NL[:, router.layer]
        rec_NK = self.index_NLK[:, router.layer]
        index_NK = torch.where(missing_N[:, None], live_NK, rec_NK)
        weights_NK = router.adapter.gate(router.module, logits_NE, index_NK)
        if torch._C._current_graph_task_id() == -1:  # not a checkpoint recomputation in backward
            self._count(missing_N, rec_NK, live_NK)
        return (logits_NE, weights_NK, index_NK, *output[3:])

    def _count(self, missing_N: torch.Tensor, rec_NK: torch.Tensor, live_NK: torch.Tensor) -> None:
        have_N = ~missing_N
        num_have = have_N.sum()
        num_pad = 0 if self.pad_N is None else self.pad_N.sum()
        hit_NK = (rec_NK[:, :, None] == live_NK[:, None, :]).any(dim=-1)
        disagree = (~hit_NK & have_N[:, None]).sum()
        k = rec_NK.shape[1]
        self.stats._add(torch.stack([num_have, missing_N.numel() - num_have - num_pad, num_have * k, disagree]))


@contextmanager
def replay_routing(
    model: nn.Module,
    routing_BSLK: np.ndarray | torch.Tensor,
    *,
    padding_BS: torch.Tensor | None = None,
) -> Iterator[ReplayStats]:
    """Within the block, every forward of `model` selects the recorded experts.

    routing_BSLK: [batch, seq, MoE layers, top_k] shaped like the input_ids of the forwards inside the
    block (packed sequences: pack routing the same way as the ids). padding_BS: True at padding
    positions (live router, not counted). Yields ReplayStats, updated as forwards run; the
    Prometheus gauges are set when the block exits.
    """
    routers = find_routers(model)
    index_BSLK, missing_BSL = routing_to_tensors(routing_BSLK)
    _, _, layers, k = index_BSLK.shape
    if layers != len(routers) or k != routers[0].top_k:
        raise ValueError(
            f"routing has {layers} layers x top_k {k}, the model has {len(routers)} MoE layers x "
            f"top_k {routers[0].top_k}")
    present = index_BSLK[~missing_BSL]
    if present.numel() and int(present.max()) >= routers[0].num_experts:
        raise ValueError(
            f"routing expert id {int(present.max())} is out of range for {routers[0].num_experts} experts")
    if padding_BS is not None and tuple(padding_BS.shape) != tuple(index_BSLK.shape[:2]):
        raise ValueError(
            f"padding mask shape {list(padding_BS.shape)} differs from routing's {list(index_BSLK.shape[:2])}")
    rep = _Replayer(index_BSLK, missing_BSL, None if padding_BS is None else padding_BS.bool())
    handles = []
    for r in routers:
        def hook(module: nn.Module, args: tuple, output: tuple, router: MoERouter = r) -> tuple:
            return rep.hook(router, output)
        # prepend: hooks registered earlier (e.g. capture) must see the replayed selection
        handles.append(r.module.register_forward_hook(hook, prepend=True))
    try:
        yield rep.stats
    finally:
        for h in handles:
            h.remove()
        REPLAY_COVERAGE.set(rep.stats.coverage)
        ROUTER_DISAGREEMENT.set(rep.stats.disagreement_rate)
