"""Issue 19 case 2: records are checked against the model when they arrive, and a step that still
fails quarantines its group (reason in status) instead of killing the trainer after every restart."""

from __future__ import annotations

import math
import re
import signal
from pathlib import Path

import numpy as np
import pytest
from test_service import Trainer, _config, _group
from trainer_synth import segment, trajectory

from t1.trainer.admission import ModelBounds, check_admissible
from t1.trainer.buffer import TrajectoryBuffer
from t1.trainer.validation import RoutingSpec
from t1.trajectory.serialization import decode_trajectory, encode_trajectory
from t1.trajectory.types import Segment, TurnSpan
from t1.v1 import trainer_pb2 as pb
from t1.workdir import StorageError

BOUNDS = ModelBounds(vocab_size=100, routing=RoutingSpec(num_layers=2, top_k=2, num_experts=8), max_abs_reward=1e3)


def _seg(ids: list[int] | None = None, logprobs: list[float] | None = None, routing: np.ndarray | None = None,
         turns: tuple[TurnSpan, ...] = ()) -> Segment:
    return segment(ids or [20, 21, 22, 30, 40], 3, logprobs=logprobs, routing=routing, turns=turns)


def _routing(top: int) -> np.ndarray:
    arr = np.zeros((5, 2, 2), dtype=np.uint8)
    arr[2, 1, 0] = top
    return arr


@pytest.mark.parametrize(("seg", "reward", "needle"), [
    (_seg(ids=[20, 21, 22, 5_000_000, 40]), 1.0, "token id 5000000 is outside"),
    (_seg(ids=[20, -7, 22, 30, 40]), 1.0, "token id -7 is outside"),
    (_seg(), 1e30, "reward 1e+30"),
    (_seg(), -1e30, "reward -1e+30"),
    (_seg(), math.nan, "reward nan"),
    (_seg(logprobs=[-0.5, 50.0]), 1.0, "behaviour logprob 50.0"),
    (_seg(logprobs=[-0.5, -math.inf]), 1.0, "behaviour logprob -inf"),
    (_seg(routing=_routing(8)), 1.0, "routing names expert 8"),
    (_seg(turns=(TurnSpan(3, 5, math.inf),)), 1.0, "turn [3, 5): reward inf"),
])
def test_records_the_model_cannot_take_are_refused_by_name(seg: Segment, reward: float, needle: str) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        check_admissible(trajectory("t-0", "g", [seg], reward=reward), BOUNDS)


def test_a_sound_record_is_admitted() -> None:
    check_admissible(trajectory("t-0", "g", [_seg(logprobs=[-0.5, 0.0], routing=_routing(7))], reward=-3.0), BOUNDS)


def test_a_damaged_buffer_is_named(tmp_path: Path) -> None:
    path = tmp_path / "buffer.sqlite"
    path.write_bytes(b"\x00garbage" * 512)
    with pytest.raises(StorageError, match=str(path)):
        TrajectoryBuffer(path)


def _env(tid: str, group: str, ids: list[int], reward: float = 1.0, logprobs: list[float] | None = None
         ) -> pb.TrajectoryEnvelope:
    t = trajectory(tid, group, [segment(ids, 3, logprobs=logprobs)], reward=reward)
    return pb.TrajectoryEnvelope(trajectory_id=tid, payload=encode_trajectory(t))


def test_bad_records_are_rejected_and_a_failing_group_is_quarantined(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = _config(tmp_path, tiny_model_dir, max_steps=4)
    # A buffer written before accept-time checks existed: a group whose token ids crash the embedding.
    buffer = TrajectoryBuffer(tmp_path / "work" / "buffer.sqlite")
    for a in range(2):
        t = trajectory(f"q-{a}", "q", [segment([20, 21, 22, 5_000_000, 40], 3)], reward=1.0, attempt=a)
        assert buffer.add(t.id, "q", encode_trajectory(t))
    buffer.close()
    log = tmp_path / "trainer.log"
    tr = Trainer(config, log)
    try:
        acks = tr.push([_env("x-0", "x", [20, 21, 22, 5_000_000, 40]), _env("x-1", "x", [20, -7, 22, 30, 40]),
                        _env("y-0", "y", [20, 21, 22, 30, 40], reward=1e30),
                        _env("y-1", "y", [20, 21, 22, 30, 40], logprobs=[50.0, -1.0])])
        assert {a.status for a in acks.values()} == {pb.ACK_STATUS_REJECTED}
        assert "token id 5000000" in acks["x-0"].error and "token id -7" in acks["x-1"].error
        assert "reward 1e+30" in acks["y-0"].error and "logprob 50.0" in acks["y-1"].error
        assert {a.status for a in tr.push(_group("a")).values()} == {pb.ACK_STATUS_ACCEPTED}
        st = tr.wait(lambda s: s.step >= 1 and s.quarantined_groups == 1)
        assert "step 1 failed" in st.last_quarantine_reason and "IndexError" in st.last_quarantine_reason
        tr.proc.send_signal(signal.SIGKILL)
        tr.proc.wait(30)
    finally:
        tr.close()
    with Trainer(config, log) as tr:  # no crash loop: the quarantined group is never taken again
        assert {a.status for a in tr.push(_group("b")).values()} == {pb.ACK_STATUS_ACCEPTED}
        st = tr.wait(lambda s: s.stage == pb.TRAINER_STAGE_DONE)
        assert st.step == 4 and st.quarantined_groups == 1 and tr.proc.poll() is None
        tr.stop()
    buffer = TrajectoryBuffer(tmp_path / "work" / "buffer.sqlite")
    [q] = buffer.quarantined()
    assert q.group_id == "q" and q.trajectory_ids == ("q-0", "q-1")
    payload = buffer.payload("q-0")
    assert payload is not None and int(decode_trajectory(payload).segments[0].token_ids.max()) == 5_000_000
    # The rejected members' groups completed with infra stand-ins (dropped by the infra policy).
    trained = sorted(tid for s in buffer.steps() for tid in s.trajectory_ids)
    assert trained == sorted(f"{g}-{a}" for g in "abxy" for a in range(2)), "each once, q never"
    buffer.close()
