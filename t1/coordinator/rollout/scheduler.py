"""The training scheduler: groups of G attempts per task, a global episode limit, staleness-bounded admission.

A group is admitted only when
  - the spool has room (back-pressure from a slow or absent trainer), and
  - admitting it keeps the run within the staleness bound: at most (max_policy_lag + 1) *
    groups_per_step admitted groups that the trainer has not yet taken, so no admitted episode can
    still be waiting for training once its policy is more than max_policy_lag versions old (the
    bound AReaL uses). What the trainer has taken is counted in its steps since admission began
    (every critic warm-up or PPO step takes groups_per_step groups) and the groups it set aside,
    not in policy versions: SFT moves the version without taking a group, a critic warm-up step
    takes groups without moving it.
Each attempt then waits for a slot of the global concurrency limit (shared with eval jobs).

Groups a dead coordinator left (`resumed`: their unfinished members, continued from their
journals) start first, each counted as an admitted group: the staleness bound holds them as it
holds new ones, and each group completes at the trainer once its resumed members end (its
members that had ended are in the spool already).

The scheduler owns the episode tasks it starts: `stop()` ends admission (and wakes whoever waits on
`stopped`), `drain(grace_s)` gives running episodes the grace period, cancels the rest and waits for
them. An episode task that fails (an error the episode could not turn into a result) stops
admission; `drain` raises that error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, Protocol

from t1.coordinator.spool.trajectory_spool import Spool
from t1.rpc.loop import wait_or_stop
from t1.tasks.spec import TaskSpec

log = logging.getLogger(__name__)

AttemptFn = Callable[[TaskSpec, str, int], Coroutine[Any, Any, object]]
ResumeFn = Callable[[], Coroutine[Any, Any, object]]  # continues one member of a resumed group


class TrainerProgress(Protocol):
    """How many of the admitted groups the trainer has taken, and a wait for that to change."""

    def groups_taken(self) -> int: ...

    async def changed(self) -> None: ...


def staleness_allows(admitted_groups: int, groups_taken: int, max_policy_lag: int, groups_per_step: int) -> bool:
    """Whether one more group fits the staleness bound (pure)."""
    return admitted_groups - groups_taken < (max_policy_lag + 1) * groups_per_step


class Scheduler:
    def __init__(self, group_size: int, limiter: asyncio.Semaphore, spool: Spool, max_policy_lag: int,
                 groups_per_step: int, new_group_id: Callable[[TaskSpec], str]) -> None:
        self.group_size = group_size
        self._limiter = limiter
        self._spool = spool
        self._lag = max_policy_lag
        self._groups_per_step = groups_per_step
        self._new_group_id = new_group_id
        self.admitted_groups = 0
        self.stopped = asyncio.Event()
        self._episodes: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None

    def stop(self) -> None:
        self.stopped.set()

    @property
    def stopping(self) -> bool:
        return self.stopped.is_set()

    @property
    def running(self) -> int:
        """Episode tasks started and not yet ended."""
        return len(self._episodes)

    async def run(self, tasks: Iterator[TaskSpec], progress: TrainerProgress | None, attempt: AttemptFn,
                  resumed: Mapping[str, Sequence[ResumeFn]] | None = None) -> None:
        """Start the `resumed` groups' members (by group id), then admit groups of `tasks` until stop(); returns
        without waiting for running episodes. Without `progress` (no trainer) admission ends at the staleness
        bound."""
        for group_id, members in (resumed or {}).items():
            self.admitted_groups += 1
            log.info("group %s: %d unfinished attempts resume", group_id, len(members))
            for i, member in enumerate(members):
                if not await self._acquire_slot():
                    return  # their journals stay: the next start resumes them
                self._start(self._resume_one(member), f"resume-{group_id}-{i}")
        while not self.stopping:
            if not await self._until_admissible(progress):
                return
            task = next(tasks)
            group_id = self._new_group_id(task)
            self.admitted_groups += 1
            log.info("group %s: %d attempts of %s", group_id, self.group_size, task.id)
            for i in range(self.group_size):
                if not await self._acquire_slot():
                    # Stopping mid-group: the trainer discards incomplete groups, nothing to undo.
                    return
                self._start(self._one(attempt, task, group_id, i), f"episode-{group_id}-a{i}")

    async def drain(self, grace_s: float) -> int:
        """Wait up to `grace_s` for running episodes, cancel the rest, wait for them; returns how many were
        cancelled. Raises the first error an episode task failed with."""
        pending = set(self._episodes)
        cancelled = 0
        if pending:
            log.info("%d episodes in flight: waiting up to %.0fs", len(pending), grace_s)
            _, late = await asyncio.wait(pending, timeout=grace_s) if grace_s > 0 else (set(), pending)
            for t in late:
                t.cancel()
            cancelled = len(late)
            if late:
                await asyncio.wait(late)
        if self._failure is not None:
            raise self._failure
        return cancelled

    def _start(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._episodes.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._episodes.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        if self._failure is None:
            self._failure = task.exception()
            log.error("episode task %s failed: %r; admission stops", task.get_name(), self._failure)
        self.stop()

    async def _one(self, attempt: AttemptFn, task: TaskSpec, group_id: str, i: int) -> None:
        try:
            await attempt(task, group_id, i)
        finally:
            self._limiter.release()

    async def _resume_one(self, member: ResumeFn) -> None:
        try:
            await member()
        finally:
            self._limiter.release()

    async def _until_admissible(self, progress: TrainerProgress | None) -> bool:
        while not self.stopping:
            if not self._spool.has_room:
                await wait_or_stop(self._spool.wait_for_room(), self.stopped)
                continue
            taken = progress.groups_taken() if progress is not None else 0
            if not staleness_allows(self.admitted_groups, taken, self._lag, self._groups_per_step):
                if progress is None:
                    await self.stopped.wait()
                else:
                    await wait_or_stop(progress.changed(), self.stopped)
                continue
            return True
        return False

    async def _acquire_slot(self) -> bool:
        if not await wait_or_stop(self._limiter.acquire(), self.stopped):
            return False
        if self.stopping:
            self._limiter.release()
            return False
        return True
