"""SharedBaselines: one measurement per group; a failed or cancelled measurement is made again by the next."""

from __future__ import annotations

import asyncio

import pytest

from t1.agent.baseline import SharedBaselines


async def test_a_failed_or_cancelled_measurement_passes_to_the_next_attempt() -> None:
    baselines = SharedBaselines()
    started = asyncio.Event()
    release = asyncio.Event()
    calls: list[str] = []

    def measure(who: str, fail: bool = False):
        async def run() -> int:
            calls.append(who)
            started.set()
            await release.wait()
            if fail:
                raise OSError("the verifier shell died")
            return 3
        return run

    first = asyncio.create_task(baselines.get("g", measure("a", fail=True)))
    await started.wait()
    waiters = [asyncio.create_task(baselines.get("g", measure(w))) for w in "bc"]
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(OSError):
        await first
    assert await asyncio.gather(*waiters) == [3, 3]
    assert calls == ["a", "b"], "after the failure one waiter measured, the other shared its result"
    assert baselines.measured == 1 and baselines.shared == 1

    release.clear()
    started.clear()
    measuring = asyncio.create_task(baselines.get("h", measure("d")))
    await started.wait()
    waiting = asyncio.create_task(baselines.get("h", measure("e")))
    await asyncio.sleep(0)
    waiting.cancel()  # a waiter's own cancellation does not stop the measurement
    with pytest.raises(asyncio.CancelledError):
        await waiting
    measuring.cancel()  # the measuring attempt's does: the next attempt measures
    with pytest.raises(asyncio.CancelledError):
        await measuring
    release.set()
    assert await baselines.get("h", measure("f")) == 3 and calls[-2:] == ["d", "f"]


async def test_only_the_last_groups_are_kept() -> None:
    baselines = SharedBaselines(keep=2)

    async def three() -> int:
        return 3

    for g in "abc":
        await baselines.get(g, three)
    await baselines.get("a", three)
    assert baselines.measured == 4 and baselines.shared == 0
