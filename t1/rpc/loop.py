"""Run the main coroutine on uvloop where it is installed, else on the default asyncio loop.

Before the loop starts, every object that exists (imported modules, config, compiled templates)
is moved out of the collector's reach with `gc.freeze()`: they live as long as the process, and a
full collection would otherwise walk them all while the event loop stands still. A service that
builds long-lived state inside the loop calls `freeze_long_lived()` once it is built.

`cancel_and_wait` and `wait_or_stop` are the one way T1 ends a task and races work against a stop.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def freeze_long_lived() -> None:
    """Exempt everything alive now from future collections (collect first, so no garbage is frozen)."""
    gc.collect()
    gc.freeze()


def run(main: Coroutine[Any, Any, T]) -> T:
    freeze_long_lived()
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel `task` and wait until it has ended. Its own cancellation is absorbed here; a cancellation
    of the caller while it waits is not, and an error the task ended with is raised."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def wait_or_stop(aw: Awaitable[Any], stop: asyncio.Event) -> bool:
    """Wait until `aw` completes or `stop` is set, whichever comes first; True when `aw` completed.

    A coroutine that loses the race is cancelled (it was started here); a task or future passed in
    is left running: its owner decides what happens to it. An error `aw` ended with is raised.
    """
    owned = not isinstance(aw, asyncio.Future)
    work = asyncio.ensure_future(aw)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        completed = work.done()
        await cancel_and_wait(stopped)
        if owned and not completed:
            await cancel_and_wait(work)
    if not completed:
        return False
    work.result()
    return True
