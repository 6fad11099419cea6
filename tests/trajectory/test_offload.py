"""The end-of-episode worker: order, errors and context carry over, and the event loop keeps running meanwhile."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from t1.trajectory.offload import offload

_who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="")


def _busy(seconds: float) -> int:
    """Pure Python work holding the GIL, like the re-tokenization checks and msgpack building."""
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        n += 1
    return n


async def test_runs_on_one_worker_thread_in_submission_order() -> None:
    seen: list[tuple[int, int]] = []

    def job(i: int) -> int:
        seen.append((i, threading.get_ident()))
        return i * i

    assert await asyncio.gather(*(offload(job, i) for i in range(20))) == [i * i for i in range(20)]
    assert [i for i, _ in seen] == list(range(20))
    threads = {t for _, t in seen}
    assert len(threads) == 1 and threading.get_ident() not in threads


async def test_exception_and_context_reach_the_caller() -> None:
    def fails(what: str) -> None:
        raise ValueError(f"{what} from {_who.get()}")

    _who.set("episode-7")
    with pytest.raises(ValueError, match="bad record from episode-7"):
        await offload(fails, "bad record")
    assert await offload(lambda: 1) == 1, "the worker survives a failed job"


async def test_event_loop_keeps_ticking_during_a_long_job() -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    t = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    ticks = 0
    _busy(0.3)  # the same job on the loop: not one tick
    assert ticks == 0
    await offload(_busy, 0.3)
    t.cancel()
    assert ticks >= 5, f"the loop ran only {ticks} times during 0.3 s of offloaded work"
