"""Garbage collection for a coordinator that holds thousands of live episodes.

CPython's collections stop the event loop. With 4,000 live episodes (about 800k tracked objects)
a full collection takes 0.3-1 s and the default policy starts one whenever the long-lived heap has
grown by a quarter, several per minute while episodes grow; generation-1 collections took 20 ms
on average and up to 125 ms, about 70 a minute (bench/load/run.py, 4,000 episodes). Here only
generation 0 is collected automatically (about 1.5 ms each); everything older is collected by the
scheduled full collection, whose stall is rare and shows up in the log and in
`t1_gc_full_collection_seconds`. Cyclic garbage that outlives one young collection waits for the
next scheduled one; most episode state is freed by reference counting and never gets there.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from t1.metrics import registry as m

log = logging.getLogger(__name__)
NEVER = 1_000_000_000  # collections of the generation below between automatic ones of this one


def young_collections_only() -> tuple[int, int, int]:
    """Collect only generation 0 automatically; returns the thresholds before."""
    before = gc.get_threshold()
    gc.set_threshold(before[0], NEVER, NEVER)
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


class GcSchedule:
    """The policy above for one run: `start()` once long-lived state is built, `stop()` restores CPython's."""

    def __init__(self, full_interval_s: float) -> None:
        self.full_interval_s = full_interval_s  # 0: leave CPython's policy alone
        self._before: tuple[int, int, int] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.full_interval_s <= 0 or self._task is not None:
            return
        self._before = young_collections_only()
        self._task = asyncio.create_task(scheduled_full_collections(self.full_interval_s), name="t1-gc-full")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._before is not None:
            gc.set_threshold(*self._before)
            self._before = None
