"""Measurements of the load benchmark: event-loop lag, process CPU and RSS, per-turn overhead, machine facts.

Turn overhead is everything in a turn that is neither model time nor command time: for each
episode, the wall time from the start of one generate call to the start of the next, minus the
model time the simulated server spent on that request (its latency formula applied to the
request's own token counts) and minus the round trips of the turn's commands through the shell.
What remains is the coordinator's own work plus the gRPC and event-loop queueing it causes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from dataclasses import dataclass, field

import numpy as np
import psutil


def percentiles(values: list[float] | np.ndarray, qs: tuple[float, ...] = (50, 99)) -> dict[str, float]:
    """{'p50': ..., 'p99': ..., 'max': ...}; NaN for an empty list."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return {**{f"p{q:g}": float("nan") for q in qs}, "max": float("nan")}
    return {**{f"p{q:g}": float(np.percentile(arr, q)) for q in qs}, "max": float(arr.max())}


def _schedstat() -> tuple[float, float]:
    """This thread's time on a CPU and waiting on a run queue so far, in seconds (Linux schedstat)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            on_cpu, run_wait, _ = f.read().split()
        return int(on_cpu) / 1e9, int(run_wait) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), 0.0


class LagSampler:
    """Sleeps `interval_s` in a loop and records how late each wake-up was (seconds).

    With each it records how the loop thread spent that sleep: on a CPU (`on_cpu`, seconds; a
    late wake-up with about as much CPU as wall time was the loop running long callbacks) and
    runnable but waiting for a CPU (`run_wait`); the rest of a late wake-up's wall time the thread
    was blocked (on the GIL, a lock or a blocking call).
    """

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self.on_cpu: list[float] = []
        self.run_wait: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self.recording = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="bench-lag-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + self.interval_s
            cpu0, wait0 = _schedstat()
            await asyncio.sleep(self.interval_s)
            if self.recording:
                cpu1, wait1 = _schedstat()
                self.samples.append(max(0.0, loop.time() - expected))
                self.on_cpu.append(cpu1 - cpu0)
                self.run_wait.append(wait1 - wait0)

    def late_wakeups(self, threshold_s: float = 0.05) -> dict[str, float]:
        """Wake-ups later than `threshold_s`: how many, and how the loop thread spent their wall time."""
        late = [i for i, lag in enumerate(self.samples) if lag > threshold_s]
        wall = sum(self.samples[i] + self.interval_s for i in late)
        if not wall:
            return {"threshold_ms": threshold_s * 1e3, "count": 0}
        on_cpu = sum(self.on_cpu[i] for i in late) / wall
        run_wait = sum(self.run_wait[i] for i in late) / wall
        return {"threshold_ms": threshold_s * 1e3, "count": len(late), "on_cpu_share": round(on_cpu, 3),
                "run_queue_share": round(run_wait, 3), "blocked_share": round(max(0.0, 1 - on_cpu - run_wait), 3)}


class GcPauses:
    """Durations of this process's garbage collections while recording (a full collection stalls the loop)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self.recording = False
        self._t0 = 0.0

    def start(self) -> None:
        gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self.recording:
            self.pauses.append((info["generation"], time.perf_counter() - self._t0))

    def summary(self) -> dict[str, dict[str, float]]:
        """Per generation: collections, total and longest pause in ms."""
        out = {}
        for gen in (0, 1, 2):
            d = [s for g, s in self.pauses if g == gen]
            out[f"gen{gen}"] = {"count": len(d), "total_ms": round(sum(d) * 1e3, 1),
                                "max_ms": round(max(d, default=0.0) * 1e3, 1)}
        return out


def gc_census(top: int = 12) -> dict[str, object]:
    """How many objects the collector tracks (what a full collection walks), and the most common types."""
    from collections import Counter

    objects = gc.get_objects()
    counts = Counter(type(o).__name__ for o in objects)
    return {"tracked": len(objects), "top_types": dict(counts.most_common(top))}


class ProcessMeter:
    """CPU time and RSS of named processes (this one, the sim server, the sandbox server and its shells)."""

    def __init__(self, pids: dict[str, int | list[int]]) -> None:
        """A name may stand for several processes (the sandbox hosts): their CPU is summed, their RSS too."""
        self.procs = {name: [psutil.Process(p) for p in ([pid] if isinstance(pid, int) else pid)]
                      for name, pid in pids.items()}

    def cpu(self, with_children: bool = False) -> dict[str, float]:
        out = {}
        for name, procs in self.procs.items():
            try:
                out[name] = sum(_cpu_s(proc, with_children) for proc in procs)
            except psutil.Error:
                out[name] = float("nan")
        return out

    def rss(self, name: str) -> int:
        return sum(int(proc.memory_info().rss) for proc in self.procs[name])


def _cpu_s(proc: psutil.Process, with_children: bool) -> float:
    t = proc.cpu_times()
    total = t.user + t.system
    if with_children:
        total += t.children_user + t.children_system
        for child in proc.children(recursive=True):
            try:
                ct = child.cpu_times()
                total += ct.user + ct.system
            except psutil.Error:
                continue
    return total


@dataclass(slots=True)
class TurnClock:
    """Per-episode timestamps that turn model and command timings into per-turn overhead samples.

    A turn runs from the start of one generate call to the start of the next in the same
    episode; its overhead is that wall time minus the turn's model time and command time.
    """

    overhead_s: list[float] = field(default_factory=list)
    model_s: list[float] = field(default_factory=list)
    command_s: list[float] = field(default_factory=list)
    generations: int = 0
    _last_start: dict[str, float] = field(default_factory=dict)
    _pending_model: dict[str, float] = field(default_factory=dict)
    _pending_cmd: dict[str, float] = field(default_factory=dict)

    def generate_started(self, episode: str) -> None:
        now = time.monotonic()
        last = self._last_start.get(episode)
        if last is not None:
            model = self._pending_model.pop(episode, 0.0)
            cmd = self._pending_cmd.pop(episode, 0.0)
            self.overhead_s.append(max(0.0, now - last - model - cmd))
        self._last_start[episode] = now

    def model(self, episode: str, simulated_s: float) -> None:
        self.generations += 1
        self.model_s.append(simulated_s)
        self._pending_model[episode] = self._pending_model.get(episode, 0.0) + simulated_s

    def command(self, episode: str, wall_s: float) -> None:
        self.command_s.append(wall_s)
        self._pending_cmd[episode] = self._pending_cmd.get(episode, 0.0) + wall_s

    def reset_samples(self) -> None:
        """Start a measurement window: drop samples and counts, keep each episode's clock."""
        self.overhead_s.clear()
        self.model_s.clear()
        self.command_s.clear()
        self.generations = 0

    def end(self, episode: str) -> None:
        for d in (self._last_start, self._pending_model, self._pending_cmd):
            d.pop(episode, None)
