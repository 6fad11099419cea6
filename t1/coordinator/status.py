"""Run status: polls the trainer's GetStatus into metrics and the run log, and answers GetRunStatus."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from t1.config.service import AuthConfig
from t1.metrics import registry as m
from t1.metrics.runlog import RunLog
from t1.metrics.write_faults import WriteFaults
from t1.rpc.client import call_options, make_channel
from t1.v1 import coordinator_pb2 as cpb
from t1.v1 import trainer_pb2 as pb
from t1.v1 import trainer_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from t1.coordinator.rollout import RolloutStats
    from t1.coordinator.run_state import RunState
    from t1.coordinator.spool import Spool

log = logging.getLogger(__name__)


class TrainerStatusPoller:
    """Every `interval_s`: GetStatus -> gauges, a 'trainer' run-log record when the step moves; `done` when DONE."""

    def __init__(self, target: str, runlog: RunLog | None, auth: AuthConfig | None = None,
                 interval_s: float = 2.0, rollouts: Callable[[], Mapping[str, float]] | None = None) -> None:
        self.target = target
        self._runlog = runlog
        self._rollouts = rollouts  # cumulative training-episode tallies, written with each trainer record
        self._auth = auth or AuthConfig()
        self.interval_s = interval_s
        self.last: pb.TrainerStatus | None = None
        self.done = asyncio.Event()
        self.last_metrics: dict[str, float] = {}
        self.last_quarantined: int | None = None
        self._moved = asyncio.Event()  # replaced after each move: waiters of the old one wake

    async def run(self) -> None:
        channel = make_channel(self.target, self._auth)
        stub = pb_grpc.TrainerServiceStub(channel)
        opts = call_options(self._auth, 10.0)
        try:
            while True:
                try:
                    self._apply(await stub.GetStatus(pb.GetStatusRequest(), **opts.kw()))
                except grpc.aio.AioRpcError as err:
                    log.debug("trainer GetStatus: %s", err.code().name)
                await asyncio.sleep(self.interval_s)
        finally:
            await channel.close()

    def _apply(self, st: pb.TrainerStatus) -> None:
        moved = self.last is None or st.step != self.last.step or st.stage != self.last.stage
        self.last = st
        if st.last_metrics:
            self.last_metrics = dict(st.last_metrics)
            m.set_trainer_metrics(self.last_metrics)
        m.TRAINER_STEP.set(st.step)
        quarantined_before = self.last_quarantined
        if st.quarantined_groups > (self.last_quarantined or 0):
            log.error("trainer quarantined %d groups so far; last: %s", st.quarantined_groups,
                      st.last_quarantine_reason)
        self.last_quarantined = st.quarantined_groups
        m.TRAINER_QUARANTINED_GROUPS.set(st.quarantined_groups)
        if moved or st.quarantined_groups != quarantined_before:
            self._moved.set()
            self._moved = asyncio.Event()
        if moved and self._runlog is not None:
            extra = {"rollouts": dict(self._rollouts())} if self._rollouts is not None else {}
            self._runlog.write("trainer", step=st.step, stage=pb.TrainerStage.Name(st.stage), version=st.policy_version,
                               buffered=st.buffered_trajectories, metrics=self.last_metrics, **extra)
        if st.stage == pb.TRAINER_STAGE_DONE:
            self.done.set()

    async def moved(self) -> None:
        """Return at the next status whose step, stage or quarantine count differs from the last one."""
        await self._moved.wait()

    def progress(self, groups_per_step: int) -> TrainerProgressFromStatus:
        """The trainer's progress from now on, for the scheduler's staleness bound."""
        return TrainerProgressFromStatus(self, groups_per_step)

    @property
    def stage_name(self) -> str:
        if self.last is None:
            return "unknown"
        return pb.TrainerStage.Name(self.last.stage).removeprefix("TRAINER_STAGE_").lower()


class TrainerProgressFromStatus:
    """Groups the trainer has taken since this was made: its steps since then (each takes groups_per_step
    groups: made when SFT is over, every later step is a warm-up or PPO step) plus the groups it set aside."""

    def __init__(self, poller: TrainerStatusPoller, groups_per_step: int) -> None:
        self._poller = poller
        self._per_step = groups_per_step
        self._start = self._counts()

    def _counts(self) -> tuple[int, int] | None:
        st = self._poller.last
        return None if st is None else (st.step, st.quarantined_groups)

    def groups_taken(self) -> int:
        now = self._counts()
        if now is None:
            return 0
        if self._start is None:  # no status had come yet when admission began: count from the first one
            self._start = now
        return (now[0] - self._start[0]) * self._per_step + (now[1] - self._start[1])

    async def changed(self) -> None:
        await self._poller.moved()


class TurnRate:
    """Turns per second over a sliding window, from the rollout turn counter."""

    def __init__(self, read_turns: Callable[[], int], window_s: float = 30.0) -> None:
        self._read = read_turns
        self._window_s = window_s
        self._points: list[tuple[float, int]] = []

    def sample(self) -> float:
        now, turns = time.monotonic(), self._read()
        self._points.append((now, turns))
        while len(self._points) > 2 and now - self._points[0][0] > self._window_s:
            self._points.pop(0)
        t0, n0 = self._points[0]
        rate = (turns - n0) / (now - t0) if now > t0 else 0.0
        m.ROLLOUT_TURNS_PER_SECOND.set(rate)
        return rate


@dataclass(frozen=True, slots=True)
class RunStatusReader:
    """Answers GetRunStatus from what owns each number: the run state, the rollout stats, the spool, the pool."""

    name: str
    state: RunState
    stats: RolloutStats
    spool: Spool
    healthy_servers: Callable[[], int]
    turn_rate: TurnRate
    faults: WriteFaults | None = None

    def __call__(self) -> cpb.RunStatus:
        stats, trainer = self.stats, self.state.trainer
        last = trainer.poller.last if trainer is not None else None
        return cpb.RunStatus(
            run_name=self.name, policy_version=trainer.weights.version if trainer is not None else 0,
            trainer_step=last.step if last is not None else 0, active_episodes=stats.active,
            finished_episodes=stats.finished, spool_pending=self.spool.pending_count,
            spool_bytes=self.spool.pending_bytes, trainer_connected=trainer is not None and trainer.link.connected,
            healthy_inference_servers=self.healthy_servers(),
            infra_failure_rate=stats.infra_errors / stats.finished if stats.finished else 0.0,
            turns_per_second=self.turn_rate.sample(), stage=self.state.phase.value,
            spool_write_error=self.spool.write_error, spool_held=self.spool.held_count,
            write_errors=self.faults.errors() if self.faults is not None else [])
