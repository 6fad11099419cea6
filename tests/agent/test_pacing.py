"""LoopPacer: at most per_tick steps per event-loop iteration, first come first served."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from t1.agent.pacing import LoopPacer, pace


async def _admissions(pacer: LoopPacer, n: int, cancel: set[int] = frozenset()) -> list[tuple[int, int]]:
    """(step index, loop iteration) of each admitted step, with an iteration counter running alongside."""
    loop = asyncio.get_running_loop()
    iteration, running = 0, True

    def count() -> None:
        nonlocal iteration
        iteration += 1
        if running:
            loop.call_soon(count)

    loop.call_soon(count)
    admitted: list[tuple[int, int]] = []

    async def one(i: int) -> None:
        await pacer.step()
        admitted.append((i, iteration))

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    await asyncio.sleep(0)
    for i in cancel:
        tasks[i].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    running = False
    return admitted


async def test_at_most_per_tick_steps_per_iteration_in_arrival_order() -> None:
    pacer = LoopPacer(10)
    admitted = await _admissions(pacer, 100)
    assert [i for i, _ in admitted] == list(range(100))
    per_iteration = Counter(it for _, it in admitted)
    assert max(per_iteration.values()) <= 10 and len(per_iteration) >= 10
    assert pacer.deferred == 90


async def test_a_cancelled_waiter_gives_its_place_up() -> None:
    pacer = LoopPacer(5)
    admitted = await _admissions(pacer, 30, cancel={12, 13})
    assert sorted(i for i, _ in admitted) == [i for i in range(30) if i not in (12, 13)]
    assert max(Counter(it for _, it in admitted).values()) <= 5


async def test_unpaced_and_bad_settings() -> None:
    await pace(0)  # returns at once
    with pytest.raises(ValueError, match="per_tick"):
        LoopPacer(0)
