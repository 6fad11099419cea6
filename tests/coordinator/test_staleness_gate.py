"""The scheduler's staleness bound counts what the trainer has taken, not policy versions.

A critic warm-up step takes groups without moving the policy version, and SFT moves the version without
taking any: a bound on versions stalls admission during a warm-up longer than max_policy_lag + 1 steps
(the run waits forever) and opens it without limit after SFT. The poller here is the real one, fed the
statuses the trainer's GetStatus returns.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from t1.coordinator.rollout.scheduler import Scheduler, staleness_allows
from t1.coordinator.spool.trajectory_spool import Spool
from t1.coordinator.trainer_side.status import TrainerStatusPoller
from t1.tasks.formats.dataset import load_task
from t1.tasks.spec import TaskSpec
from t1.tasks.synth.curriculum import synthesize_curriculum
from t1.v1 import trainer_pb2 as pb

GROUP, PER_STEP, LAG = 2, 2, 1


def test_bound_counts_groups_not_yet_taken() -> None:
    assert staleness_allows(3, 0, LAG, PER_STEP) and not staleness_allows(4, 0, LAG, PER_STEP)
    assert staleness_allows(6, 4, LAG, PER_STEP) and not staleness_allows(6, 2, LAG, PER_STEP)


def _status(step: int, version: int, stage: int, quarantined: int = 0) -> pb.TrainerStatus:
    return pb.TrainerStatus(step=step, policy_version=version, stage=stage, quarantined_groups=quarantined)


async def test_warmup_steps_and_set_aside_groups_reopen_admission(tmp_path: Path, monkeypatch) -> None:
    poller = TrainerStatusPoller("127.0.0.1:1", None)
    poller._apply(_status(600, 600, pb.TRAINER_STAGE_CRITIC_WARMUP))  # SFT is over: 600 versions, no group taken
    spool = Spool.open(tmp_path / "spool", 1 << 30, 1 << 20)
    sched = Scheduler(
        GROUP, asyncio.Semaphore(100), spool, LAG, PER_STEP, lambda task: f"{task.id}-{sched.admitted_groups}"
    )
    task = load_task(synthesize_curriculum(tmp_path / "tasks", 1)[0])

    async def attempt(task: TaskSpec, group_id: str, i: int) -> None:
        return None

    admit = asyncio.ensure_future(sched.run(itertools.repeat(task), poller.progress(PER_STEP), attempt))

    async def settles_at(n: int) -> None:
        for _ in range(50):
            await asyncio.sleep(0.01)
        assert sched.admitted_groups == n

    await settles_at((LAG + 1) * PER_STEP)  # not 600 versions' worth
    for k in range(1, 4):  # three warm-up steps: the version stays 600, each step takes PER_STEP groups
        poller._apply(_status(600 + k, 600, pb.TRAINER_STAGE_CRITIC_WARMUP))
        await settles_at((LAG + 1 + k) * PER_STEP)
    poller._apply(_status(603, 600, pb.TRAINER_STAGE_CRITIC_WARMUP, quarantined=1))  # a group set aside
    await settles_at((LAG + 4) * PER_STEP + 1)
    sched.stop()
    await admit
    spool.close()
