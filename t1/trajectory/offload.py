"""One worker thread for the heavy pure work at the end of an episode, off the event loop.

Exporting a trajectory (routing concatenation, TITO checks) and encoding it take tens to hundreds of
milliseconds of CPU for a 300-turn episode; on the event loop that is a stall of every other episode,
and when many episodes end together, a stall of seconds. In a worker thread the loop keeps its turn:
the worker yields the GIL every switch interval. It is one thread on purpose: the work holds the GIL
most of the time, so more threads would add no throughput and only make the loop wait behind more
GIL holders. Jobs run in the order they are submitted.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def _worker() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="t1-offload")
        return _executor


async def offload(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` on the worker thread (with the caller's context variables); its exception is raised here.

    Cancelling the caller does not stop a job that has started: it runs to the end and its result is dropped.
    """
    ctx = contextvars.copy_context()
    call = functools.partial(ctx.run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_worker(), call)
