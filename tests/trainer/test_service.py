"""t1-trainer as a real process on 127.0.0.1: durable acks, duplicates, rejects, SIGKILL and restart
(versions continue, nothing acknowledged is lost or trained twice), checkpoints, clean SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
import yaml
from trainer_synth import segment, trajectory

from t1.rpc.client import make_sync_channel
from t1.rpc.introspect import health_status, list_services
from t1.trajectory.serialization import encode_trajectory
from t1.v1 import trainer_pb2 as pb
from t1.v1 import trainer_pb2_grpc


def _config(tmp_path: Path, model_dir: Path, max_steps: int) -> Path:
    cfg = {
        "rollout": {"group_size": 2},
        "metrics": {"port": None},
        "logging": {"level": "INFO"},
        "trainer": {
            "work_dir": str(tmp_path / "work"), "policy_path": str(model_dir), "max_steps": max_steps,
            "keep_versions": 3, "checkpoint_every": 1,
            "server": {"host": "127.0.0.1", "port": 0, "grace_s": 0.5},
            "rl": {"groups_per_step": 1, "token_budget": 256},
            "deepspeed": {"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0,
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": True}}},
        },
    }
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Trainer:
    def __init__(self, config: Path, log: Path) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "T1_API_TOKEN": ""}
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        self.log = log.open("a")
        self.proc = subprocess.Popen([sys.executable, "-m", "t1.cli.trainer", "--config", str(config)],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # DeepSpeed also prints on stdout
            if line.startswith("t1-trainer listening on"):
                break
        else:
            raise AssertionError(f"trainer did not start:\n{log.read_text()[-3000:]}")
        self.address = line.split()[-1]
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # keep the pipe drained
        self.channel = make_sync_channel(self.address)
        self.stub = trainer_pb2_grpc.TrainerServiceStub(self.channel)

    def push(self, envelopes: list[pb.TrajectoryEnvelope]) -> dict[str, pb.PushAck]:
        return {a.trajectory_id: a for a in self.stub.PushTrajectories(iter(envelopes), timeout=60)}

    def wait(self, cond, timeout: float = 120.0) -> pb.TrainerStatus:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            if cond(st):
                return st
            assert self.proc.poll() is None, "trainer exited"
            time.sleep(0.2)
        raise AssertionError(f"condition not reached; last status {st}")

    def stop(self) -> None:
        """SIGTERM: the trainer commits what it has and exits 0."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(60) == 0

    def close(self) -> None:
        self.channel.close()
        self.log.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.close()


def _group(name: str) -> list[pb.TrajectoryEnvelope]:
    out = []
    for a in range(2):
        t = trajectory(f"{name}-{a}", name, [segment([20, 21, 22, 30 + a, 40 + a], 3)], reward=float(a), attempt=a)
        out.append(pb.TrajectoryEnvelope(trajectory_id=t.id, payload=encode_trajectory(t)))
    return out


def _statuses(acks: dict[str, pb.PushAck]) -> set[int]:
    return {a.status for a in acks.values()}


def test_kill_and_restart_loses_nothing_and_trains_nothing_twice(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = _config(tmp_path, tiny_model_dir, max_steps=4)
    log = tmp_path / "trainer.log"
    tr = Trainer(config, log)
    try:
        assert health_status(tr.address, "t1.v1.TrainerService") == "SERVING"
        assert "t1.v1.TrainerService" in list_services(tr.address)
        acks = tr.push(_group("a"))
        assert _statuses(acks) == {pb.ACK_STATUS_ACCEPTED}
        bad = tr.push([pb.TrajectoryEnvelope(trajectory_id="junk", payload=b"\x01\x02"),
                       pb.TrajectoryEnvelope(trajectory_id="other", payload=_group("z")[0].payload)])
        assert bad["junk"].status == pb.ACK_STATUS_REJECTED and "msgpack" in bad["junk"].error
        assert bad["other"].status == pb.ACK_STATUS_REJECTED and "differs" in bad["other"].error
        st = tr.wait(lambda s: s.policy_version == 1)
        assert st.stage == pb.TRAINER_STAGE_PPO and st.step == 1 and "clip_fraction" in st.last_metrics
        versions = tr.stub.WatchVersions(pb.WatchVersionsRequest(from_version=0), timeout=30)
        first = next(versions)
        assert first.version == 1 and Path(first.path, "model.safetensors").is_file()
        versions.cancel()
        assert _statuses(tr.push(_group("b"))) == {pb.ACK_STATUS_ACCEPTED}
        tr.wait(lambda s: s.policy_version == 2)
        assert _statuses(tr.push(_group("c"))) == {pb.ACK_STATUS_ACCEPTED}
        tr.proc.send_signal(signal.SIGKILL)  # during or right before step 3
        tr.proc.wait(30)
    finally:
        tr.close()

    with Trainer(config, log) as tr:
        again = tr.push(_group("b") + _group("c"))
        assert _statuses(again) == {pb.ACK_STATUS_DUPLICATE}
        assert _statuses(tr.push(_group("d"))) == {pb.ACK_STATUS_ACCEPTED}
        st = tr.wait(lambda s: s.stage == pb.TRAINER_STAGE_DONE)
        assert st.step == 4 and st.policy_version == 4 and st.buffered_trajectories == 0
        assert st.accepted_trajectories == 8
        stream = tr.stub.WatchVersions(pb.WatchVersionsRequest(from_version=1), timeout=30)
        assert [next(stream).version for _ in range(3)] == [2, 3, 4]  # keep_versions=3
        stream.cancel()
        info = tr.stub.SaveCheckpoint(pb.SaveCheckpointRequest(tag="final"), timeout=60)
        assert info.step == 4 and info.policy_version == 4 and Path(info.path).is_dir()
        for bad, named in (("../x", "use letters"), ("t" * 5000, "5000 characters, at most 64"),
                           ("tag\u0663", "use letters")):
            with pytest.raises(grpc.RpcError) as err:
                tr.stub.SaveCheckpoint(pb.SaveCheckpointRequest(tag=bad), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and named in (err.value.details() or "")
        tr.stop()

    work = tmp_path / "work"
    db = sqlite3.connect(str(work / "buffer.sqlite"))
    steps = db.execute("SELECT step, policy_version, trajectory_ids FROM steps ORDER BY step").fetchall()
    assert [(s, v) for s, v, _ in steps] == [(1, 1), (2, 2), (3, 3), (4, 4)]
    trained = [tid for _, _, ids in steps for tid in json.loads(ids)]
    assert sorted(trained) == sorted(f"{g}-{a}" for g in "abcd" for a in range(2))  # each exactly once
    assert sorted(p.name for p in (work / "weights").iterdir()) == ["v2", "v3", "v4"]
    db.close()


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  rl:\n    clip_epz: 0.2\n")
    proc = subprocess.run([sys.executable, "-m", "t1.cli.trainer", "--config", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "trainer.rl.clip_epz: unknown key" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "t1.cli.trainer", "--set", f"trainer.policy_path={tmp_path}/none",
                           "--set", "trainer.warm_start.sft_steps=2"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "sft_steps > 0 needs demos_path" in proc.stderr


def test_steered_sft_over_grpc_keeps_the_best_rounds_weights(tmp_path: Path, tiny_model_dir: Path) -> None:
    from safetensors.torch import load_file

    demos = tmp_path / "demos.msgpack"
    with demos.open("wb") as f:
        for i in range(3):
            f.write(encode_trajectory(trajectory(f"demo{i}", "demo", [segment([11, 12, 13, 500 + i, 501], 3)],
                                                 reward=1.0)))
    config = _config(tmp_path, tiny_model_dir, max_steps=1)
    cfg = yaml.safe_load(config.read_text())
    cfg["trainer"]["warm_start"] = {"sft_steps": 20, "demos_path": str(demos), "sft_eval_every": 2,
                                    "sft_validation_set": "val", "sft_lr": 1e-2, "sft_batch": 2}
    cfg["tasks"] = {"sets": {"val": {"path": str(tmp_path / "val")}}}
    config.write_text(yaml.safe_dump(cfg))
    with Trainer(config, tmp_path / "trainer.log") as tr:
        for allow in (2, 4):
            tr.stub.SteerSft(pb.SteerSftRequest(allow_steps=allow), timeout=60)
            tr.wait(lambda s, n=allow: s.policy_version == n)
        with pytest.raises(grpc.RpcError) as err:
            tr.stub.SteerSft(pb.SteerSftRequest(keep_step=2), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "keep_step" in (err.value.details() or "")
        st = tr.stub.SteerSft(pb.SteerSftRequest(allow_steps=4, end=True, keep_step=2), timeout=120)
        assert st.policy_version == 5 and st.stage == pb.TRAINER_STAGE_PPO, "SFT ended (no warm-up configured)"
        stream = tr.stub.WatchVersions(pb.WatchVersionsRequest(from_version=4), timeout=30)
        restored = next(stream)
        stream.cancel()
        assert restored.version == 5
        weights = tmp_path / "work" / "weights"
        kept, last, now = (load_file(str(weights / v / "model.safetensors")) for v in ("v2", "v4", "v5"))
        assert all(kept[k].equal(now[k]) for k in kept), "v5 is round 1's weights, served as a new version"
        assert not all(last[k].equal(now[k]) for k in last)
        tr.stop()
