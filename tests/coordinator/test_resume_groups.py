"""The scheduler regroups what a dead coordinator left: resumed members start first, under the concurrency limit,
and each resumed group counts as an admitted group against the staleness bound."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from t1.coordinator.rollout.scheduler import Scheduler
from t1.coordinator.spool.trajectory_spool import Spool
from t1.tasks.formats.dataset import load_task
from t1.tasks.spec import TaskSpec
from t1.tasks.synth.curriculum import synthesize_curriculum


async def test_resumed_groups_start_first_and_count_against_the_staleness_bound(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path / "spool", 1 << 30, 1 << 20)
    limiter = asyncio.Semaphore(3)
    # group size 2, lag 0, one group per step: at most one admitted group the trainer has not taken.
    sched = Scheduler(2, limiter, spool, 0, 1, lambda task: f"{task.id}-new")
    task = load_task(synthesize_curriculum(tmp_path / "tasks", 1)[0])
    ran: list[str] = []
    release = asyncio.Event()

    def member(name: str):
        async def run() -> None:
            ran.append(name)
            await release.wait()
        return run

    async def attempt(task: TaskSpec, group_id: str, i: int) -> None:
        ran.append(f"{group_id}-a{i}")

    try:
        admit = asyncio.ensure_future(sched.run(itertools.repeat(task), None, attempt,
                                                {"g-old": [member("g-old-a1"), member("g-old-a3")]}))
        for _ in range(50):
            await asyncio.sleep(0.01)
        # The resumed group is the one group the bound allows: nothing new is admitted while it runs.
        assert ran == ["g-old-a1", "g-old-a3"] and sched.admitted_groups == 1 and sched.running == 2
        assert not admit.done()
        release.set()
        sched.stop()
        await admit
        assert await sched.drain(5.0) == 0
        assert limiter._value == 3  # every slot came back
    finally:
        spool.close()
