"""GetRunStatus: one RunStatus message from what owns each number (run state, rollout stats, spool, pool)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from t1.coordinator.rollout.runner import RolloutStats
from t1.coordinator.run.run_state import RunState
from t1.coordinator.spool.trajectory_spool import Spool
from t1.coordinator.trainer_side.status import TurnRate
from t1.metrics.write_faults import WriteFaults
from t1.v1 import coordinator_pb2 as cpb


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
            resumed_episodes=stats.resumed, resume_turns_lost=stats.resume_turns_lost,
            resume_failed=stats.resume_failed,
            turns_per_second=self.turn_rate.sample(), stage=self.state.phase.value,
            spool_write_error=self.spool.write_error, spool_held=self.spool.held_count,
            write_errors=self.faults.errors() if self.faults is not None else [])
