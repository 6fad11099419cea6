"""Run status: polls the trainer's GetStatus into metrics and the run log; the rollout's turn rate.

GetRunStatus is answered by `t1.coordinator.run.run_status.RunStatusReader` from these and the run state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import grpc

from t1.config.shared import AuthConfig
from t1.metrics import registry as m
from t1.metrics.runlog import RunLog
from t1.rpc.client import call_options, make_channel
from t1.v1 import trainer_pb2 as pb
from t1.v1 import trainer_pb2_grpc as pb_grpc

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
