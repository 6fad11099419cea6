"""Kill -9 the real t1-trainer during training: rollouts keep filling the spool, and once the trainer is
back (same port, its buffer and checkpoint on disk) every spooled trajectory is delivered and training ends."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml
from test_local_run import root, small_config  # noqa: F401  (root is a fixture)

from t1.v1 import coordinator_pb2 as pb
from t1.v1 import coordinator_pb2_grpc as pb_grpc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_trainer(config: Path, port: int, log: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "t1.cli.trainer", "--config", str(config), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=log.open("ab"), text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        if re.search(r"listening on \S+:\d+", line):
            return proc
    raise AssertionError(f"trainer exited with {proc.wait()}: {log.read_text()[-3000:]}")


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "run.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _wait(cond, timeout_s: float, what: str, coord: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert coord.poll() is None, f"coordinator exited while waiting for {what}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {log.read_text()[-3000:]}"
        time.sleep(0.5)


@pytest.mark.slow  # real trainer started twice plus a coordinator stack: about three minutes here
def test_trainer_killed_mid_training_then_back_gets_everything(root: Path, tiny_model_dir: Path) -> None:  # noqa: F811
    port = _free_port()
    cfg = small_config(root, tiny_model_dir, max_steps=3)
    cfg["trainer"]["endpoint"] = f"127.0.0.1:{port}"
    cfg["trainer"]["warm_start"] = {}
    cfg["trainer"]["rl"]["max_policy_lag"] = 2
    cfg["coordinator"]["eval"]["before_training"] = False
    config = root / "local.yaml"
    config.write_text(yaml.safe_dump(cfg))
    tlog, clog = root / "trainer.log", root / "coordinator.log"
    trainer = _start_trainer(config, port, tlog)
    coord = subprocess.Popen([sys.executable, "-m", "t1.cli.coordinator", "--config", str(config)], cwd=root,
                             stdout=clog.open("wb"), stderr=subprocess.STDOUT,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    run_dir = root / "run"
    try:
        _wait(lambda: any(e["event"] == "weights" for e in _events(run_dir)), 400, "policy v1", coord, clog)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(10)
        address = json.loads((run_dir / "coordinator.json").read_text())["address"]
        seen: list[pb.RunStatus] = []
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.CoordinatorServiceStub(channel)

            def spooled_while_down() -> bool:
                st = stub.GetRunStatus(pb.GetRunStatusRequest(), timeout=10)
                seen.append(st)
                return not st.trainer_connected and st.spool_pending >= 2

            _wait(spooled_while_down, 240, "rollouts into the spool while the trainer is down", coord, clog)
        trainer = _start_trainer(config, port, tlog)
        rc = coord.wait(400)
    finally:
        for p in (coord, trainer):
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert rc == 0, clog.read_text()[-4000:]
    assert "resumed from checkpoint" in tlog.read_text()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["trainer"]["step"] == 3 and report["trainer"]["stage"] == "done", report["trainer"]
    assert report["rollouts"]["spool_pending"] == 0, "everything spooled while the trainer was away was delivered"
