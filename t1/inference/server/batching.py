"""Batched decode for the torch backend: sessions in the decode phase share one forward.

A request's decode step is a `DecodeItem` (its cache, the token to feed, its routing sink, its
sampling params and generator). `DecodeBatcher` queues them and one driver task runs them in
groups of at most max_batch; prefill chunks stay per session and go through the same FIFO step
lock, so they interleave fairly with batched decode steps.

A group holds items of one weight version. Sessions whose caches are KV slots (kv_slots.py, the
default) share a forward whatever their lengths: each row attends to its own length under a padding
mask at its own position. Sessions with plain DynamicCaches (a model whose cache is not plain full
attention, or a backend made with kv_slots=False) group only by equal cache length: their caches
stack along the batch dimension with no padding (stack_caches) and each row's new position is
appended back to its own cache. Rows are sampled with their own params and generator, so a
request's tokens do not depend on what it was batched with beyond float rounding of the batched
matmuls (a token changes only at a near tie).

Legend: B = rows of a batch, L = cached positions, K = experts per token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from t1.inference.server.kv_slots import SlotCache

log = logging.getLogger(__name__)


@dataclass(slots=True)
class DecodeItem:
    """One session's decode step: feed `token` through `cache`, sample the next token."""

    loaded: Any                 # torch_backend._Loaded: model, routing recorder, version
    cache: Any                  # the session's DynamicCache (owned by the request)
    token: int
    sink: list | None           # the request's routing sink, or None
    params: Any                 # SamplingParams
    gen: torch.Generator

    @property
    def key(self) -> tuple[int, int]:
        """Items with equal keys can share one forward: same weights, and for DynamicCaches the same length."""
        if isinstance(self.cache, SlotCache):
            return id(self.loaded), -1
        return id(self.loaded), self.cache.get_seq_length()


def batchable(cache: Any) -> bool:
    """Whether a cache can share a forward: KV slots, or every layer a full, initialised DynamicLayer."""
    if isinstance(cache, SlotCache):
        return True
    return all(type(layer) is DynamicLayer and layer.is_initialized for layer in cache.layers)


def stack_caches(caches: list[Any], config: Any) -> Any:
    """A DynamicCache holding the given equal-length caches as rows 0..B-1."""
    batched: Any = DynamicCache(config=config)
    for i, layer in enumerate(batched.layers):
        layer.update(torch.cat([c.layers[i].keys for c in caches], dim=0),
                     torch.cat([c.layers[i].values for c in caches], dim=0))
    return batched


def append_new_positions(batched: Any, caches: list[Any], new: int) -> None:
    """Append each row's last `new` positions of `batched` to its own cache."""
    for i, layer in enumerate(batched.layers):
        for row, cache in enumerate(caches):
            cache.layers[i].update(layer.keys[row:row + 1, :, -new:], layer.values[row:row + 1, :, -new:])


def split_routing(batch_sink: list[list[torch.Tensor]], sinks: list[list | None]) -> None:
    """Hand row b of every layer's [B, K] expert ids (one decode position per row) to sink b."""
    for layer, chunks in enumerate(batch_sink):
        ids_BK = torch.cat(chunks, dim=0)
        for row, sink in enumerate(sinks):
            if sink is not None:
                sink[layer].append(ids_BK[row:row + 1])


def take_group(pending: list[tuple[DecodeItem, asyncio.Future]], max_batch: int
               ) -> list[tuple[DecodeItem, asyncio.Future]]:
    """Remove and return the oldest live item and up to max_batch - 1 later ones that can share its forward."""
    pending[:] = [(item, fut) for item, fut in pending if not fut.done()]  # cancelled requests leave
    if not pending:
        return []
    head = pending[0][0]
    if max_batch == 1 or not batchable(head.cache):
        return [pending.pop(0)]
    group: list[tuple[DecodeItem, asyncio.Future]] = []
    rest: list[tuple[DecodeItem, asyncio.Future]] = []
    for entry in pending:
        if len(group) < max_batch and entry[0].key == head.key and batchable(entry[0].cache):
            group.append(entry)
        else:
            rest.append(entry)
    pending[:] = rest
    return group


def _settle(group: list[tuple[DecodeItem, asyncio.Future]], steps: list[Any]) -> None:
    """Hand each live request of a batch its step."""
    for (_, fut), step in zip(group, steps, strict=True):
        if not fut.done():
            fut.set_result(step)


class DecodeBatcher:
    """Queues decode steps and runs them in batches through `run_batch`, holding the backend's step lock."""

    def __init__(self, run_batch: Callable[[list[DecodeItem]], Awaitable[list[Any]]], max_batch: int,
                 step_lock: Callable[[], asyncio.Lock]) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch: must be >= 1, got {max_batch}")
        self._run_batch = run_batch
        self._step_lock = step_lock
        self.max_batch = max_batch
        self._pending: list[tuple[DecodeItem, asyncio.Future]] = []
        self._driver: asyncio.Task | None = None
        self.batch_sizes: list[int] = []  # rows of every batch run, for tests and metrics

    async def decode(self, item: DecodeItem) -> Any:
        """Run one decode step of `item`, batched with whatever else is waiting; returns its sampled step."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        if self._driver is None or self._driver.done():
            self._driver = asyncio.create_task(self._drive(), name="t1-decode-batcher")
        return await fut

    async def _drive(self) -> None:
        while True:
            # Let the requests woken by the last batch queue their next step before grouping.
            for _ in range(2):
                await asyncio.sleep(0)
            async with self._step_lock():
                # Grouped once the step lock is ours: sessions that finished prefill meanwhile join.
                group = take_group(self._pending, self.max_batch)
                if not group:
                    return
                items = [item for item, _ in group]
                try:
                    steps = await self._run_batch(items)
                except Exception as exc:  # the error belongs to the requests of this batch
                    for _, fut in group:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
            self.batch_sizes.append(len(items))
            _settle(group, steps)
            del group, items, steps  # the batch's caches go now: a request that ended frees its KV slot at once

    def close(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
        for _, fut in self._pending:
            fut.cancel()
        self._pending.clear()
