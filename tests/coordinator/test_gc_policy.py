"""The coordinator's GC schedule: only generation 0 automatically, full collections on a timer, each timed."""

from __future__ import annotations

import asyncio
import gc

from t1.coordinator.run.gc_policy import NEVER, scheduled_full_collections, young_collections_only
from t1.metrics import registry as m


def _full_collections() -> float:
    return m.REGISTRY.get_sample_value("t1_gc_full_collection_seconds_count") or 0.0


async def test_full_collections_run_on_schedule_only() -> None:
    before = young_collections_only()
    try:
        assert gc.get_threshold() == (before[0], NEVER, NEVER)
        full_before = gc.get_stats()[2]["collections"]
        gen1_before = gc.get_stats()[1]["collections"]
        garbage = [[] for _ in range(50_000)]  # many young collections' worth of survivors
        for a in garbage:
            a.append(a)  # cycles: only a full collection frees them once they are old
        del garbage
        for _ in range(200):
            [[] for _ in range(1000)]
        assert gc.get_stats()[2]["collections"] == full_before  # none started by itself
        assert gc.get_stats()[1]["collections"] == gen1_before
        observed = _full_collections()
        task = asyncio.create_task(scheduled_full_collections(0.05))
        await asyncio.sleep(0.3)
        task.cancel()
        assert gc.get_stats()[2]["collections"] > full_before
        assert _full_collections() > observed
    finally:
        gc.set_threshold(*before)
