"""TrainerService over gRPC: durable intake of trajectories, status, version announcements, checkpoints.

The servicer only adapts: PushTrajectories decodes each record, checks it against the model
(t1/trainer/admission.py), stores it in the durable buffer (off the event loop) and acknowledges it by id; training
happens in the loop of
t1/trainer/app.py, which the servicer wakes when data arrives and asks for manual checkpoints.
A rejected record that decodes leaves an infra-error stand-in in its group, so the group completes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc

from t1.rpc.errors import RequestError, rpc_errors
from t1.trainer.admission import ModelBounds, check_admissible
from t1.trainer.buffer import TrajectoryBuffer
from t1.trainer.core import Stage, TrainState
from t1.trainer.publish import PublishedVersion
from t1.trainer.validation import validate_trajectory
from t1.trajectory.serialization import decode_trajectory, encode_trajectory
from t1.trajectory.types import EpisodeStatus, Trajectory
from t1.v1 import trainer_pb2 as pb
from t1.v1 import trainer_pb2_grpc

log = logging.getLogger(__name__)
MAX_TAG_CHARS = 64  # a checkpoint folder name: well within any file system's name limit

STAGE_PB = {
    Stage.SFT: pb.TRAINER_STAGE_SFT, Stage.CRITIC_WARMUP: pb.TRAINER_STAGE_CRITIC_WARMUP,
    Stage.PPO: pb.TRAINER_STAGE_PPO, Stage.DONE: pb.TRAINER_STAGE_DONE,
}


class VersionBoard:
    """Published versions, and a condition that wakes watchers when a new one appears."""

    def __init__(self, published: list[PublishedVersion]) -> None:
        self._versions = sorted(published, key=lambda v: v.version)
        self._changed = asyncio.Condition()

    async def announce(self, version: PublishedVersion) -> None:
        async with self._changed:
            self._versions = [v for v in self._versions if v.version != version.version] + [version]
            self._changed.notify_all()

    def after(self, version: int) -> list[PublishedVersion]:
        return [v for v in self._versions if v.version > version]

    async def wait_after(self, version: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self.after(version)))


@dataclass(frozen=True, slots=True)
class CheckpointRequest:
    tag: str
    done: asyncio.Future


@dataclass(frozen=True, slots=True)
class SteerSftRequest:
    """SteerSft for the train loop: SFT steps allowed in all, or the end of SFT; done once it holds."""

    allow_steps: int
    end: bool
    done: asyncio.Future
    keep_step: int = 0  # with end: the SFT step whose weights become the warm start (0: the steps taken)


LoopRequest = CheckpointRequest | SteerSftRequest


def _version_pb(v: PublishedVersion) -> pb.WeightVersion:
    return pb.WeightVersion(version=v.version, path=str(v.path), step=v.step, published_unix=v.published_unix)


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, buffer: TrajectoryBuffer, group_size: int, board: VersionBoard, wake: asyncio.Event,
                 checkpoints: asyncio.Queue[LoopRequest], status: Callable[[], tuple[TrainState, Stage]],
                 bounds: ModelBounds | None = None) -> None:
        self.buffer, self.group_size, self.board, self.wake = buffer, group_size, board, wake
        self.checkpoints, self.status, self.bounds = checkpoints, status, bounds

    async def PushTrajectories(self, request_iterator: AsyncIterator[pb.TrajectoryEnvelope],
                               context: grpc.aio.ServicerContext) -> AsyncIterator[pb.PushAck]:
        async for env in request_iterator:
            yield await self._accept(env)

    async def _accept(self, env: pb.TrajectoryEnvelope) -> pb.PushAck:
        traj = None
        try:
            if not env.trajectory_id:
                raise ValueError("trajectory_id is empty")
            decoded = decode_trajectory(env.payload)
            if decoded.id != env.trajectory_id:
                raise ValueError(f"trajectory_id {env.trajectory_id!r} differs from the record's id {decoded.id!r}")
            traj = decoded
            if self.bounds is not None:
                check_admissible(traj, self.bounds)
            else:
                validate_trajectory(traj)
        except ValueError as exc:
            log.warning("rejected trajectory %r: %s", env.trajectory_id, exc)
            if traj is not None and traj.group_id:
                await self._stand_in(traj)
            return pb.PushAck(trajectory_id=env.trajectory_id, status=pb.ACK_STATUS_REJECTED, error=str(exc))
        new = await asyncio.to_thread(self.buffer.add, traj.id, traj.group_id, bytes(env.payload))
        if new:
            self.wake.set()
        return pb.PushAck(trajectory_id=traj.id, status=pb.ACK_STATUS_ACCEPTED if new else pb.ACK_STATUS_DUPLICATE)

    async def _stand_in(self, traj: Trajectory) -> None:
        """A rejected member will never come again: an infra-error record takes its place, so its group
        completes and `reward.infra_error_policy` decides, as for any failed attempt. A record that
        does not decode, or names another id than its envelope, names no group it can be trusted for."""
        stand_in = Trajectory(id=traj.id, task_id=traj.task_id, group_id=traj.group_id, attempt=traj.attempt,
                              segments=(), reward=0.0, status=EpisodeStatus.INFRA_ERROR)
        if await asyncio.to_thread(self.buffer.add, traj.id, traj.group_id, encode_trajectory(stand_in)):
            self.wake.set()

    @rpc_errors
    async def GetStatus(self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext) -> pb.TrainerStatus:
        return await self._status()

    @rpc_errors
    async def SteerSft(self, request: pb.SteerSftRequest, context: grpc.aio.ServicerContext) -> pb.TrainerStatus:
        if request.allow_steps < 0:
            raise RequestError(f"allow_steps must be >= 0, got {request.allow_steps}")
        if request.keep_step < 0 or (request.keep_step and not request.end):
            raise RequestError(f"keep_step must be >= 0 and comes with end, got keep_step={request.keep_step}, "
                               f"end={request.end}")
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        await self.checkpoints.put(SteerSftRequest(int(request.allow_steps), request.end, done,
                                                   int(request.keep_step)))
        self.wake.set()
        await done
        return await self._status()

    async def _status(self) -> pb.TrainerStatus:
        state, stage = self.status()
        counts = await asyncio.to_thread(self.buffer.counts, self.group_size)
        reason = await asyncio.to_thread(self.buffer.last_quarantine_reason) if counts["quarantined"] else ""
        metrics = {k: float(v) for k, v in state.last_metrics.items()}
        return pb.TrainerStatus(
            step=state.step, policy_version=state.policy_version, stage=STAGE_PB[stage],
            buffered_trajectories=counts["pending"], buffered_groups=counts["groups"],
            accepted_trajectories=counts["accepted"], dropped_stale_tokens=state.dropped_stale_tokens,
            last_metrics=metrics, quarantined_groups=counts["quarantined"], last_quarantine_reason=reason,
        )

    @rpc_errors
    async def WatchVersions(self, request: pb.WatchVersionsRequest,
                            context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WeightVersion]:
        if request.from_version < 0:
            raise RequestError(f"from_version must be >= 0, got {request.from_version}")
        last = request.from_version
        while True:
            for v in self.board.after(last):
                yield _version_pb(v)
                last = v.version
            await self.board.wait_after(last)

    @rpc_errors
    async def SaveCheckpoint(self, request: pb.SaveCheckpointRequest,
                             context: grpc.aio.ServicerContext) -> pb.CheckpointInfo:
        tag = request.tag or "manual"
        if len(tag) > MAX_TAG_CHARS:
            raise RequestError(f"tag: {len(tag)} characters, at most {MAX_TAG_CHARS}")
        if not tag.isascii() or not tag.replace("-", "").replace("_", "").isalnum() or tag.startswith("step"):
            raise RequestError(f"tag {tag!r}: use letters, digits, '-' and '_', not starting with 'step'")
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        await self.checkpoints.put(CheckpointRequest(tag, done))
        self.wake.set()
        path, state = await done
        return pb.CheckpointInfo(path=str(path), step=state.step, policy_version=state.policy_version)
