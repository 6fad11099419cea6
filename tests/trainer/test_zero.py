"""DeepSpeed beyond the default ZeRO-2 run: ZeRO-1 and ZeRO-3 (MoE blocks as leaves, activation
checkpointing) give the same update, and a 2-process torchrun trainer matches a 1-process one, with
data parallelism or with both ranks sharing each row (sequence parallelism)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from trainer_synth import segment, trainer_config, trajectory

from t1.rpc.client import make_sync_channel
from t1.trainer.core import TrainerCore
from t1.trainer.engine import free_port
from t1.trajectory.serialization import encode_trajectory
from t1.v1 import trainer_pb2 as pb
from t1.v1 import trainer_pb2_grpc


def _trajs(step: int) -> list:
    return [trajectory(f"t{step}{g}{a}", f"g{step}{g}", [segment([20, 21, 22, 30 + a, 40 + a + g], 3)],
                       reward=float(a), attempt=a) for g in range(2) for a in range(2)]


def _two_steps(work: Path, model_dir: Path, stage: int) -> dict[str, torch.Tensor]:
    cfg = trainer_config(work, model_dir, stage=stage, extra={"trainer.activation_checkpointing": stage == 3})
    core = TrainerCore(cfg)
    assert core.buffer is not None
    for step in range(2):
        for t in _trajs(step):
            core.buffer.add(t.id, t.group_id, encode_trajectory(t))
        out = core.step(core.take_groups())
    assert out.published is not None
    from transformers import AutoModelForCausalLM

    core.close()
    return AutoModelForCausalLM.from_pretrained(str(out.published.path)).state_dict()


@pytest.mark.slow
def test_zero1_and_zero3_match_zero2(tmp_path: Path, tiny_model_dir: Path) -> None:
    ref = _two_steps(tmp_path / "z2", tiny_model_dir, 2)
    for stage in (1, 3):
        got = _two_steps(tmp_path / f"z{stage}", tiny_model_dir, stage)
        assert got.keys() == ref.keys()
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], atol=2e-5, rtol=0, msg=f"ZeRO-{stage} {k}")


def _run_service(tmp_path: Path, model_dir: Path, nproc: int, sp: int = 1) -> Path:
    work = tmp_path / f"work{nproc}sp{sp}"
    cfg = {"rollout": {"group_size": 2}, "metrics": {"port": None},
           "trainer": {"work_dir": str(work), "policy_path": str(model_dir), "max_steps": 2,
                       "server": {"host": "127.0.0.1", "port": 0, "grace_s": 0.5},
                       "sequence_parallel_size": sp, "rl": {"groups_per_step": 2, "token_budget": 16},
                       "deepspeed": {"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0,
                                     "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}}}
    path = tmp_path / f"cfg{nproc}sp{sp}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(OMP_NUM_THREADS="1", T1_API_TOKEN="")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                "--master_addr", "127.0.0.1", "--master_port", str(free_port())] if nproc > 1 else [sys.executable]
    log = (tmp_path / f"log{nproc}.txt").open("w")
    proc = subprocess.Popen([*launcher, "-m", "t1.cli.trainer", "--config", str(path)], stdout=subprocess.PIPE,
                            stderr=log, text=True, env=env)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("t1-trainer listening on"):
                break
        else:
            raise AssertionError((tmp_path / f"log{nproc}.txt").read_text()[-3000:])
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        stub = trainer_pb2_grpc.TrainerServiceStub(make_sync_channel(line.split()[-1]))
        for step in range(2):
            envs = [pb.TrajectoryEnvelope(trajectory_id=t.id, payload=encode_trajectory(t)) for t in _trajs(step)]
            assert {a.status for a in stub.PushTrajectories(iter(envs), timeout=60)} == {pb.ACK_STATUS_ACCEPTED}
        deadline = time.monotonic() + 180
        while stub.GetStatus(pb.GetStatusRequest(), timeout=10).stage != pb.TRAINER_STAGE_DONE:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.3)
        # rank 0 (its pid is in endpoint.json) stops the other ranks; then torchrun exits 0
        os.kill(json.loads((work / "endpoint.json").read_text())["pid"], signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    return work / "weights" / "v2"


@pytest.mark.slow
def test_two_process_torchrun_matches_one_process(tmp_path: Path, tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    one = AutoModelForCausalLM.from_pretrained(str(_run_service(tmp_path, tiny_model_dir, 1))).state_dict()
    two = AutoModelForCausalLM.from_pretrained(str(_run_service(tmp_path, tiny_model_dir, 2))).state_dict()
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=2e-5, rtol=0, msg=k)


@pytest.mark.slow
def test_sequence_parallel_trainer_matches_one_process(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Two ranks sharing every packed row (Ulysses SP = 2) publish the weights of a 1-process run."""
    from transformers import AutoModelForCausalLM

    one = AutoModelForCausalLM.from_pretrained(str(_run_service(tmp_path, tiny_model_dir, 1))).state_dict()
    two = AutoModelForCausalLM.from_pretrained(str(_run_service(tmp_path, tiny_model_dir, 2, sp=2))).state_dict()
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=2e-5, rtol=0, msg=k)
