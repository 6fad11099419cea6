"""Garbage collection for a coordinator that holds thousands of live episodes.

CPython's full collection walks every tracked object while the event loop stands still. With
4,000 live episodes (about 800k tracked objects) one takes 0.3-1 s, and the default policy starts
one whenever the long-lived heap has grown by a quarter: several per minute while episodes grow.
Here automatic collections stop at the young generations (milliseconds each); the full collection
runs on a schedule instead, so its stall is rare and shows up in the log and in
`t1_gc_full_collection_seconds`. Cyclic garbage that outlives two young collections waits for the
next scheduled one; most episode state is freed by reference counting and never gets there.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from t1.metrics import registry as m

log = logging.getLogger(__name__)
NEVER = 1_000_000_000  # young collections between automatic full ones


def young_collections_only() -> tuple[int, int, int]:
    """Stop automatic full collections (young ones stay); returns the thresholds before."""
    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], NEVER)
    return before


async def scheduled_full_collections(interval_s: float) -> None:
    """Run a full collection every `interval_s` until cancelled, timing each."""
    while True:
        await asyncio.sleep(interval_s)
        t0 = time.perf_counter()
        found = gc.collect()
        seconds = time.perf_counter() - t0
        m.GC_FULL_SECONDS.observe(seconds)
        log.info("scheduled full collection: %.0f ms, %d unreachable objects", seconds * 1e3, found)
