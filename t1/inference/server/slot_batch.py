"""The cache of one batched decode forward over sessions' KV slots (kv_slots.py).

A SlotBatch moves its rows onto slots 0..B-1 (KvSlots.pack_front), so each layer's keys and
values for the forward are views [B, H, Lk, D] of the buffers: nothing is copied per step. Each
row's new key and value is written at that row's own length; the padding mask hides, per row, the
positions past its length (what a longer row has there belongs to nobody in this row's context),
and each row's query sits at its own position. After the forward, commit() advances every row.

Legend: B = rows, H = key/value heads, Lk = attended positions (longest row + 1), D = head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from t1.inference.server.kv_slots import KvSlots, SlotCache


@dataclass(frozen=True, slots=True)
class _BatchRows:
    """Where the rows of a decode batch are (slots 0..B-1, in order), their lengths before the step, what they
    attend."""

    slots: KvSlots
    lengths_B: torch.Tensor     # int64 cached positions of each row (its new position's index)
    attended: int               # Lk: the longest row's length + 1


class _BatchLayer(CacheLayerMixin):
    """One layer of a decode batch over slot rows: writes each row's new position, returns the rows [B, H, Lk, D]."""

    def __init__(self, batch: _BatchRows, layer: int) -> None:
        self._batch, self._layer = batch, layer
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        b = self._batch
        rows = len(b.lengths_B)
        keys, values = b.slots.keys[self._layer][:rows], b.slots.values[self._layer][:rows]
        keys[b.slots.row_ids[:rows], :, b.lengths_B] = key_states[:, :, 0]
        values[b.slots.row_ids[:rows], :, b.lengths_B] = value_states[:, :, 0]
        return keys[:, :, :b.attended], values[:, :, :b.attended]  # views: nothing copied

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._batch.attended - 1 + query_length, 0

    def get_seq_length(self) -> int:
        return self._batch.attended - 1

    def get_max_length(self) -> int:
        return -1


class SlotBatch(Cache):
    """The cache of one decode forward over sessions' slots (one new position per row), built per step.

    Building it moves the caches onto slots 0..B-1; `order` lists the given caches by slot, the
    order of the batch's rows. Its `attention_mask` [B, Lk] (None when every row has the same
    length) hides each row's positions past its own length; `position_ids` [B, 1] is each row's
    own length.
    """

    def __init__(self, caches: list[SlotCache]) -> None:
        slots = caches[0].slots
        device = slots.keys[0].device
        slots.pack_front([c.box for c in caches])
        self.order = sorted(range(len(caches)), key=lambda i: caches[i].slot)
        self.caches = [caches[i] for i in self.order]
        lengths = [c.get_seq_length() for c in self.caches]
        attended = max(lengths) + 1
        slots.reserve(attended)
        lengths_B = torch.tensor(lengths, dtype=torch.long, device=device)
        batch = _BatchRows(slots, lengths_B, attended)
        self.position_ids = lengths_B[:, None]
        self.attention_mask: torch.Tensor | None = None
        if min(lengths) != max(lengths):
            self.attention_mask = torch.arange(attended, device=device)[None, :] <= lengths_B[:, None]
        super().__init__(layers=[_BatchLayer(batch, i) for i in range(len(slots.keys))])

    def commit(self) -> None:
        """After the forward: every row's cache now holds its new position."""
        for cache in self.caches:
            for layer in cache.slot_layers:
                layer.length += 1
