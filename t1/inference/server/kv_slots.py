"""Persistent KV slots for the torch backend: every session's cache is one row of a shared buffer.

Why: decode steps of sessions with different cache lengths share one forward. Stacking their
DynamicCaches for each step (left padding them to the longest) copies every cache every step, and
each model forward copies them once more (DynamicLayer grows by concatenation): measured on the
`learn` preset with 32 sessions of 200-900 tokens, the copies cost more than the forward itself.
Here each layer has one key and one value buffer [S, H, C, D]; a session's cache is a slot (a row)
and a length. A prefill chunk writes its keys and values in place; a decode batch writes each
row's new key and value at that row's own length, then attends over its rows up to the longest
length with a padding mask, each row's query at its own position (RoPE is exact per row). Rows
of a batch are first moved onto slots 0..B-1 (a swap copies two rows, once when a session joins
the decoding set; gathering scattered rows instead would copy every row every step), so the
batch's keys and values are a view of the buffer (the decode forward's cache: slot_batch.py).

The buffers are inference tensors (made and changed under torch.inference_mode only).
Growth: the buffers double their slots or capacity (contents copied) only inside model steps,
which run one at a time on the backend's worker thread, so no forward ever writes into a buffer
that was replaced under it. A slot goes back to the free list when its SlotCache is garbage
collected (weakref.finalize: the request ended, the session LRU evicted it, weights were swapped);
that can happen on any thread, hence the lock on the free list.

Legend: S = slots, H = key/value heads, C = capacity (positions per slot), D = head dim,
B = rows of a decode batch, Lk = attended positions of a batch (longest row + 1).
"""

from __future__ import annotations

import heapq
import threading
import weakref
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

FIRST_SLOTS = 4
FIRST_CAPACITY = 128


class KvSlots:
    """The key and value buffers of every layer, the free slots, and the capacity of each slot."""

    @torch.inference_mode()
    def __init__(self, num_layers: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 max_positions: int) -> None:
        self.max_positions = max_positions
        shape = (FIRST_SLOTS, heads, min(FIRST_CAPACITY, max_positions), head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._free = list(range(FIRST_SLOTS))
        self._owners: list[list[int] | None] = [None] * FIRST_SLOTS  # slot -> its holder's box [slot]
        self._lock = threading.Lock()
        self.moves = 0  # rows moved by pack_front, for tests and metrics
        self._row_ids = torch.arange(FIRST_SLOTS, device=device)
        self.position_nbytes = 2 * num_layers * heads * head_dim * self.keys[0].element_size()

    @classmethod
    def for_model(cls, model: Any) -> KvSlots | None:
        """Slots shaped for `model`, or None when its cache is not plain full attention (sliding, linear)."""
        config = model.config
        probe = DynamicCache(config=config)
        if not probe.layers or any(type(layer) is not DynamicLayer for layer in probe.layers):
            return None
        heads = int(config.num_key_value_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        weight = next(model.parameters())
        return cls(len(probe.layers), heads, head_dim, weight.dtype, weight.device,
                   int(config.max_position_embeddings))

    @property
    def num_slots(self) -> int:
        return self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def new_cache(self) -> SlotCache:
        return SlotCache(self)

    @property
    def row_ids(self) -> torch.Tensor:
        """0..S-1 on the buffers' device (indexes the rows of a batch)."""
        if self._row_ids.numel() != self.num_slots:
            self._row_ids = torch.arange(self.num_slots, device=self.keys[0].device)
        return self._row_ids

    @property
    def num_free(self) -> int:
        return len(self._free)

    @torch.inference_mode()
    def acquire(self) -> list[int]:
        """A box [slot] holding the lowest free slot (pack_front may move it); doubles the slots when none is free."""
        with self._lock:
            if not self._free:
                old = self.num_slots
                self.keys = [self._grown(t, 0, old) for t in self.keys]
                self.values = [self._grown(t, 0, old) for t in self.values]
                self._free = list(range(old, 2 * old))
                self._owners += [None] * old
            box = [heapq.heappop(self._free)]
            self._owners[box[0]] = box
            return box

    def release(self, box: list[int]) -> None:
        with self._lock:
            self._owners[box[0]] = None
            heapq.heappush(self._free, box[0])

    @torch.inference_mode()
    def pack_front(self, boxes: list[list[int]]) -> None:
        """Move the rows of `boxes` onto slots 0..B-1, swapping out (or into a free slot) whatever is there."""
        with self._lock:
            count = len(boxes)
            taken = {box[0] for box in boxes}
            targets = (slot for slot in range(count) if slot not in taken)
            for box in boxes:
                if box[0] >= count:
                    self._swap(box[0], next(targets))

    def _swap(self, slot: int, target: int) -> None:
        """Exchange the contents and holders of two slots (one of them may be free)."""
        self.moves += 1
        moved, other = self._owners[slot], self._owners[target]
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                row = buffer[target].clone() if other is not None else None
                buffer[target].copy_(buffer[slot])
                if row is not None:
                    buffer[slot].copy_(row)
        self._owners[slot], self._owners[target] = other, moved
        if moved is not None:
            moved[0] = target
        if other is not None:
            other[0] = slot
        else:  # target was free: slot is free now
            self._free.remove(target)
            self._free.append(slot)
            heapq.heapify(self._free)

    @torch.inference_mode()
    def reserve(self, positions: int) -> None:
        """Make every slot hold at least `positions` positions (capacity doubled, at most max_positions)."""
        if positions <= self.capacity:
            return
        if positions > self.max_positions:
            raise ValueError(f"positions: {positions} is past the model's {self.max_positions} positions")
        extra = min(max(positions, 2 * self.capacity), self.max_positions) - self.capacity
        self.keys = [self._grown(t, 2, extra) for t in self.keys]
        self.values = [self._grown(t, 2, extra) for t in self.values]

    @staticmethod
    def _grown(buffer: torch.Tensor, dim: int, extra: int) -> torch.Tensor:
        shape = list(buffer.shape)
        shape[dim] = extra
        return torch.cat([buffer, buffer.new_zeros(shape)], dim=dim)


class _Row:
    """A session's slot, taken at its first write (inside a model step) and released when the row is collected.

    Layers and caches point at their row, never back, so a dropped cache is freed (and its slot
    released) by reference counting at once, not at the next cyclic garbage collection.
    """

    def __init__(self, slots: KvSlots) -> None:
        self.slots = slots
        self.box: list[int] | None = None  # [slot]: KvSlots.pack_front may move the row to another slot

    @property
    def held(self) -> bool:
        return self.box is not None

    def take(self) -> list[int]:
        """The row's box [slot], taking a slot first if it has none."""
        if self.box is None:
            self.box = self.slots.acquire()
            weakref.finalize(self, self.slots.release, self.box)
        return self.box

    @property
    def slot(self) -> int:
        return self.take()[0]


class SlotLayer(CacheLayerMixin):
    """One layer of a SlotCache: `keys`/`values` are views [1, H, length, D] of the slot's row."""

    is_croppable = True

    def __init__(self, row: _Row, layer: int) -> None:  # no super().__init__: keys/values are views
        self._row, self._layer = row, layer
        self.length = 0
        self.is_initialized = True

    @property
    def keys(self) -> torch.Tensor:
        slot = self._row.slot
        return self._row.slots.keys[self._layer][slot:slot + 1, :, :self.length]

    @keys.setter
    def keys(self, _value: torch.Tensor) -> None:
        raise AttributeError("keys: a view of the KV slots; write through update()")

    @property
    def values(self) -> torch.Tensor:
        slot = self._row.slot
        return self._row.slots.values[self._layer][slot:slot + 1, :, :self.length]

    @values.setter
    def values(self, _value: torch.Tensor) -> None:
        raise AttributeError("values: a view of the KV slots; write through update()")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if key_states.shape[0] != 1:
            raise ValueError(f"key_states: a SlotCache holds one sequence, got a batch of {key_states.shape[0]}")
        slots, slot = self._row.slots, self._row.slot
        end = self.length + key_states.shape[-2]
        slots.reserve(end)
        slots.keys[self._layer][slot, :, self.length:end] = key_states[0]
        slots.values[self._layer][slot, :, self.length:end] = value_states[0]
        self.length = end
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"tokens_to_remove: must be <= 0 (tokens from the end), got {tokens_to_remove}")
        self.length = max(self.length + tokens_to_remove, 0)


class SlotCache(Cache):
    """One session's cache: a slot of KvSlots (taken at the first write, inside a model step) and per-layer lengths."""

    def __init__(self, slots: KvSlots) -> None:
        self.slots = slots
        self._row = _Row(slots)
        self.slot_layers = [SlotLayer(self._row, i) for i in range(len(slots.keys))]
        super().__init__(layers=list(self.slot_layers))

    @property
    def slot(self) -> int:
        return self._row.slot

    @property
    def box(self) -> list[int]:
        return self._row.take()

    @property
    def nbytes(self) -> int:
        """What the slot costs: the full capacity of its row (the buffers are not ragged)."""
        return self.slots.capacity * self.slots.position_nbytes if self._row.held else 0
