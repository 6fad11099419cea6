"""The task helpers every "wait for X or stop" race and every task teardown uses."""

from __future__ import annotations

import asyncio

import pytest

from t1.rpc.loop import cancel_and_wait, wait_or_stop


async def test_work_that_wins_the_race_returns_true_and_its_error_propagates() -> None:
    stop = asyncio.Event()
    assert await wait_or_stop(asyncio.sleep(0), stop) is True

    async def fails() -> None:
        raise ValueError("bad work")

    with pytest.raises(ValueError, match="bad work"):
        await wait_or_stop(fails(), stop)


async def test_stop_cancels_a_coroutine_it_started_but_leaves_a_task_running() -> None:
    stop = asyncio.Event()
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    asyncio.get_running_loop().call_later(0.05, stop.set)
    assert await wait_or_stop(forever(), stop) is False
    assert cancelled.is_set()

    task = asyncio.ensure_future(asyncio.sleep(0.2))
    assert await wait_or_stop(task, stop) is False  # already stopped
    assert not task.done()  # the caller owns it
    await task


async def test_cancel_and_wait_ends_the_task_and_keeps_the_callers_cancellation() -> None:
    task = asyncio.ensure_future(asyncio.Event().wait())
    await cancel_and_wait(task)
    assert task.cancelled()
    await cancel_and_wait(None)

    async def slow_to_end() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # cleanup that takes a while
            raise

    slow = asyncio.ensure_future(slow_to_end())
    await asyncio.sleep(0)
    caller = asyncio.ensure_future(cancel_and_wait(slow))
    await asyncio.sleep(0.05)
    caller.cancel()  # the caller itself is cancelled while it waits: that must not be absorbed
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.gather(slow, return_exceptions=True)
