"""Event-loop lag watchdog: measures how late the loop wakes up and names the callbacks that block it.

A heartbeat coroutine sleeps `interval_s` and records its lateness (the lag histogram). A
sampler thread checks the heartbeat; while the loop is stuck past `warn_s` it samples the
loop thread's Python stack (sys._current_frames), so when the loop recovers the watchdog
can log where the time went: the slowest stalls with the code location that was running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

from t1.metrics import registry as m

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Stall:
    """One period when the loop did not run its heartbeat: how long, and where it was stuck."""

    lag_s: float
    where: list[str] = field(default_factory=list)


class LagWatchdog:
    """Start inside the loop with `start()`; `stop()` ends both the heartbeat and the sampler."""

    def __init__(self, warn_s: float = 0.1, interval_s: float = 0.05, keep: int = 5) -> None:
        self.warn_s = warn_s
        self.interval_s = interval_s
        self.keep = keep
        self.max_lag_s = 0.0
        self.stalls: list[Stall] = []  # the slowest, at most `keep`
        self._beat = time.monotonic()
        self._loop_thread: int | None = None
        self._samples: Counter[str] = Counter()
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._heartbeat(), name="lag-watchdog")
        self._thread = threading.Thread(target=self._sample, name="lag-sampler", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._thread is not None:
            self._thread.join(timeout=2)

    async def _heartbeat(self) -> None:
        while True:
            expected = time.monotonic() + self.interval_s
            await asyncio.sleep(self.interval_s)
            now = time.monotonic()
            lag = max(0.0, now - expected)
            self._beat = now
            m.EVENT_LOOP_LAG.observe(lag)
            self.max_lag_s = max(self.max_lag_s, lag)
            if lag >= self.warn_s:
                self._report(lag)

    def _report(self, lag: float) -> None:
        with self._lock:
            where = [f"{loc} ({n} samples)" for loc, n in self._samples.most_common(3)]
            self._samples.clear()
        stall = Stall(lag, where)
        self.stalls.append(stall)
        self.stalls.sort(key=lambda s: -s.lag_s)
        del self.stalls[self.keep :]
        log.warning("event loop lag %.0f ms (threshold %.0f ms); blocked in: %s", lag * 1000, self.warn_s * 1000,
                    "; ".join(where) or "<not sampled>")

    def _sample(self) -> None:
        period = min(self.interval_s, self.warn_s) / 2
        while not self._stop.wait(period):
            if time.monotonic() - self._beat < self.warn_s or self._loop_thread is None:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            if frame is None:
                continue
            stack = traceback.extract_stack(frame)
            loc = _innermost_own_frame(stack)
            with self._lock:
                self._samples[loc] += 1


def _innermost_own_frame(stack: traceback.StackSummary) -> str:
    """The deepest frame outside asyncio and the standard library, else the deepest one.

    A loop thread sampled inside the selector was not running a callback: the lag came from
    CPU starvation or another thread holding the GIL.
    """
    if stack and (stack[-1].filename.endswith("selectors.py") or stack[-1].name == "_run_once"):
        return "<idle in the selector: CPU starvation or the GIL held by another thread>"
    for fs in reversed(stack):
        path = fs.filename
        if "asyncio" in path or ("/lib/python3" in path and "site-packages" not in path):
            continue
        return f"{fs.name} at {path}:{fs.lineno}"
    fs = stack[-1]
    return f"{fs.name} at {fs.filename}:{fs.lineno}"
