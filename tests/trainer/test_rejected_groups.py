"""A member the trainer rejects never comes again: an infra-error record takes its place, so its group
completes (and `reward.infra_error_policy` decides) instead of waiting in the buffer for good."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from trainer_synth import segment, trajectory

from t1.trainer.batch import build_sequences
from t1.trainer.buffer import TrajectoryBuffer
from t1.trainer.service import TrainerServicer, VersionBoard
from t1.trajectory.serialization import decode_trajectory, encode_trajectory
from t1.trajectory.types import EpisodeStatus
from t1.v1 import trainer_pb2 as pb


def _envelope(tid: str, group: str, sampled_from: int = 3, reward: float = 1.0) -> pb.TrajectoryEnvelope:
    t = trajectory(tid, group, [segment([20, 21, 22, 30, 40], sampled_from)], reward=reward)
    return pb.TrajectoryEnvelope(trajectory_id=tid, payload=encode_trajectory(t))


async def _push(servicer: TrainerServicer, envelopes: list[pb.TrajectoryEnvelope]) -> dict[str, pb.PushAck]:
    async def stream() -> AsyncIterator[pb.TrajectoryEnvelope]:
        for env in envelopes:
            yield env

    return {ack.trajectory_id: ack async for ack in servicer.PushTrajectories(stream(), None)}  # type: ignore[arg-type]


def _servicer(buffer: TrajectoryBuffer, wake: asyncio.Event) -> TrainerServicer:
    return TrainerServicer(buffer, 3, VersionBoard([]), wake, asyncio.Queue(), lambda: None)  # type: ignore[arg-type,return-value]


def test_a_group_completes_without_its_rejected_member(tmp_path: Path) -> None:
    buffer = TrajectoryBuffer(tmp_path / "buffer.sqlite")

    async def main() -> None:
        wake = asyncio.Event()
        servicer = _servicer(buffer, wake)
        acks = await _push(servicer, [_envelope("g-0", "g", reward=0.0), _envelope("g-1", "g"),
                                      _envelope("g-2", "g", sampled_from=0)])  # loss mask on position 0
        assert acks["g-0"].status == acks["g-1"].status == pb.ACK_STATUS_ACCEPTED
        assert acks["g-2"].status == pb.ACK_STATUS_REJECTED and "position 0" in acks["g-2"].error
        assert wake.is_set()
        # A record that does not decode names no group; one with another id than its envelope is not
        # trusted to name one. Neither completes group "h".
        acks = await _push(
            servicer,
            [
                _envelope("h-0", "h"),
                _envelope("h-1", "h"),
                pb.TrajectoryEnvelope(trajectory_id="h-2", payload=b"\x01\x02"),
                pb.TrajectoryEnvelope(trajectory_id="h-3", payload=_envelope("h-9", "h").payload),
            ],
        )
        assert acks["h-2"].status == acks["h-3"].status == pb.ACK_STATUS_REJECTED
        # Sent again (a reconnect before the ack arrived): rejected again, the group unchanged.
        again = await _push(servicer, [_envelope("g-2", "g", sampled_from=0)])
        assert again["g-2"].status == pb.ACK_STATUS_REJECTED

    asyncio.run(main())
    groups = buffer.complete_groups(3, limit=10)
    assert [(g, [tid for tid, _ in members]) for g, members in groups] == [("g", ["g-0", "g-1", "g-2"])]
    trajs = [decode_trajectory(p) for _, p in groups[0][1]]
    assert [t.status for t in trajs] == [EpisodeStatus.OK, EpisodeStatus.OK, EpisodeStatus.INFRA_ERROR]
    assert trajs[2].segments == () and trajs[2].group_id == "g"
    # The stand-in is a failed attempt: dropped, or its whole group, as the policy says.
    seqs, stats = build_sequences([trajs], 0, 4, "drop_attempt", False)
    assert len(seqs) == 2 and stats.dropped_infra_trajectories == 1 and stats.dropped_groups == 0
    seqs, stats = build_sequences([trajs], 0, 4, "drop_group", False)
    assert seqs == [] and stats.dropped_groups == 1
    buffer.close()


def test_a_rejected_copy_of_an_accepted_member_changes_nothing(tmp_path: Path) -> None:
    buffer = TrajectoryBuffer(tmp_path / "buffer.sqlite")

    async def main() -> None:
        servicer = _servicer(buffer, asyncio.Event())
        assert (await _push(servicer, [_envelope("g-0", "g")]))["g-0"].status == pb.ACK_STATUS_ACCEPTED
        bad = await _push(servicer, [_envelope("g-0", "g", sampled_from=0)])
        assert bad["g-0"].status == pb.ACK_STATUS_REJECTED

    asyncio.run(main())
    [(_, members)] = buffer.complete_groups(1, limit=10)
    assert decode_trajectory(members[0][1]).status == EpisodeStatus.OK  # the accepted record stays
    buffer.close()
