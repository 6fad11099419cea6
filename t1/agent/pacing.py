"""Bounded event-loop iterations when thousands of episodes wake at once.

An asyncio iteration runs every callback that was ready when it began. When a burst of replies
or command outputs lands together (a batched reply message, a wave of shells answering), hundreds
of episodes continue in one iteration, each doing its turn's CPU work (TITO, parsing, the next
request), and every other callback (timers, keepalives, health checks, the service's RPCs) waits
for all of them: the loop lags by the burst. `LoopPacer.step()` lets at most `per_tick` episode
steps start per iteration and queues the rest, first come first served, for the next ones. Total
work is unchanged; an iteration holds about `per_tick` steps, so lag stays near
`per_tick x` (CPU of one step).

    admitted this iteration < per_tick, nobody queued  ->  go on now
    otherwise  ->  queue; a tick callback at each iteration releases the next per_tick
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque


class LoopPacer:
    """At most `per_tick` steps start per event-loop iteration; later ones wait their turn in order."""

    def __init__(self, per_tick: int, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if per_tick < 1:
            raise ValueError(f"per_tick: must be >= 1, got {per_tick}")
        self.per_tick = per_tick
        self._loop = loop  # the loop it paces; the running one when first used
        self.deferred = 0   # steps that had to wait for a later iteration
        self._used = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._tick_scheduled = False

    async def step(self) -> None:
        if self._used < self.per_tick and not self._waiters:
            self._used += 1
            self._schedule_tick()
            return
        future: asyncio.Future[None] = self._running_loop().create_future()
        self._waiters.append(future)
        self.deferred += 1
        self._schedule_tick()
        await future

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _schedule_tick(self) -> None:
        if not self._tick_scheduled:
            self._tick_scheduled = True
            self._running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        """A new iteration: release the next `per_tick` waiters (they run in the following one)."""
        self._tick_scheduled = False
        self._used = 0
        while self._waiters and self._used < self.per_tick:
            future = self._waiters.popleft()
            if not future.done():  # a cancelled waiter gives its place up
                future.set_result(None)
                self._used += 1
        if self._waiters or self._used:
            self._schedule_tick()


_pacers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, LoopPacer]] = weakref.WeakKeyDictionary()
_last: list[tuple[asyncio.AbstractEventLoop, dict[int, LoopPacer]]] = []  # the last loop's pacers: two calls a turn


async def pace(per_tick: int) -> None:
    """One step through this loop's shared pacer for `per_tick` (0: no pacing)."""
    if per_tick <= 0:
        return
    loop = asyncio.get_running_loop()
    if _last and _last[0][0] is loop:
        pacers = _last[0][1]
    else:
        pacers = _pacers.setdefault(loop, {})
        _last[:] = [(loop, pacers)]
    pacer = pacers.get(per_tick)
    if pacer is None:
        pacer = pacers[per_tick] = LoopPacer(per_tick, loop)
    await pacer.step()
