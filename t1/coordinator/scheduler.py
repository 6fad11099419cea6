"""The training scheduler: groups of G attempts per task, a global episode limit, staleness-bounded admission.

A group is admitted only when
  - the spool has room (back-pressure from a slow or absent trainer), and
  - admitting it keeps the run within the staleness bound: at most
    (policy_version + max_policy_lag + 1) * groups_per_step groups have been admitted, so no
    admitted episode can still be waiting for training once its policy is more than
    max_policy_lag versions old (the bound AReaL uses).
Each attempt then waits for a slot of the global concurrency limit (shared with eval jobs).
`stop()` stops admission; running episodes are owned by the caller's TaskGroup.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from t1.coordinator.spool import Spool
from t1.coordinator.weights import WeightSync
from t1.tasks.spec import TaskSpec

log = logging.getLogger(__name__)

AttemptFn = Callable[[TaskSpec, str, int], Coroutine[Any, Any, object]]


def staleness_allows(admitted_groups: int, policy_version: int, max_policy_lag: int, groups_per_step: int) -> bool:
    """Whether one more group fits the staleness bound (pure)."""
    return admitted_groups < (policy_version + max_policy_lag + 1) * groups_per_step


class Scheduler:
    def __init__(self, tasks: Iterator[TaskSpec], group_size: int, limiter: asyncio.Semaphore, spool: Spool,
                 weights: WeightSync | None, max_policy_lag: int, groups_per_step: int,
                 new_group_id: Callable[[TaskSpec], str]) -> None:
        self._tasks = tasks
        self.group_size = group_size
        self._limiter = limiter
        self._spool = spool
        self._weights = weights
        self._lag = max_policy_lag
        self._groups_per_step = groups_per_step
        self._new_group_id = new_group_id
        self.admitted_groups = 0
        self.running = 0
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self, tg: asyncio.TaskGroup, attempt: AttemptFn) -> None:
        """Admit groups into `tg` until stop(); returns without waiting for running episodes."""
        while not self.stopping:
            if not await self._until_admissible():
                return
            task = next(self._tasks)
            group_id = self._new_group_id(task)
            self.admitted_groups += 1
            log.info("group %s: %d attempts of %s", group_id, self.group_size, task.id)
            for i in range(self.group_size):
                if not await self._acquire_slot():
                    # Stopping mid-group: the trainer discards incomplete groups, nothing to undo.
                    return
                self.running += 1
                tg.create_task(self._one(attempt, task, group_id, i), name=f"episode-{group_id}-a{i}")

    async def _one(self, attempt: AttemptFn, task: TaskSpec, group_id: str, i: int) -> None:
        try:
            await attempt(task, group_id, i)
        finally:
            self.running -= 1
            self._limiter.release()

    def _version(self) -> int:
        return self._weights.version if self._weights is not None else 0

    async def _until_admissible(self) -> bool:
        while not self.stopping:
            if not self._spool.has_room:
                await self._wait_any(self._spool.wait_for_room())
                continue
            if not staleness_allows(self.admitted_groups, self._version(), self._lag, self._groups_per_step):
                await self._wait_any(self._weights.changed() if self._weights else self._stopping.wait())
                continue
            return True
        return False

    async def _acquire_slot(self) -> bool:
        if not await self._wait_any(self._limiter.acquire()):
            return False
        if self.stopping:
            self._limiter.release()
            return False
        return True

    async def _wait_any(self, aw: Coroutine[Any, Any, object]) -> bool:
        """Wait for `aw` or stop(), whichever comes first; True when `aw` completed."""
        work = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if work.done():
            return not work.cancelled() and work.exception() is None
        work.cancel()
        return False
