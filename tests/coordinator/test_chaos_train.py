"""Chaos (issue 19), slow: a short local training run on real processes over loopback, with kill -9 of the
coordinator, the trainer and the inference server, each once, in a seeded order at seeded moments,
each restarted on its port. After the run: every accepted trajectory was trained at most once and
every step trained only accepted ones, steps are contiguous, the run finished, and no process is left."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from chaos import accepted_ids, processes_under, trained_steps, wait_until
from test_local_run import root, small_config  # noqa: F401  (root is a fixture)

MAX_STEPS = 8  # room for three kills mid-run: a 4-step run could finish before the last seeded moment


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """One service process the test starts, kills and restarts on the same port."""

    def __init__(self, name: str, argv: list[str], log: Path, cwd: Path, ready: str | None) -> None:
        self.name, self.argv, self.log, self.cwd, self.ready = name, argv, log, cwd, ready
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        out = subprocess.PIPE if self.ready else self.log.open("ab")
        self.proc = subprocess.Popen(self.argv, cwd=self.cwd, stdout=out, stderr=self.log.open("ab"), text=True,
                                     env=env)
        if self.ready is None:
            return
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if re.search(self.ready, line):
                break
        else:
            raise AssertionError(f"{self.name} exited with {self.proc.wait()}: {self.log.read_text()[-3000:]}")
        import threading

        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "run.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


@pytest.mark.slow  # three services, each killed and restarted once: several minutes per seed on 2 cores
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_9_of_each_process_loses_nothing_and_trains_nothing_twice(root: Path, tiny_model_dir: Path,  # noqa: F811
                                                                       seed: int) -> None:
    t_port, i_port = _port(), _port()
    cfg = small_config(root, tiny_model_dir, max_steps=MAX_STEPS)
    cfg["trainer"]["endpoint"] = f"127.0.0.1:{t_port}"
    cfg["trainer"]["warm_start"] = {}
    cfg["trainer"]["rl"]["max_policy_lag"] = 2
    cfg["inference"]["pool"] = {"endpoints": [f"127.0.0.1:{i_port}"], "request_timeout_s": 120}
    cfg["coordinator"]["eval"]["before_training"] = False
    config = root / "chaos.yaml"
    config.write_text(yaml.safe_dump(cfg))
    py = sys.executable
    procs = {
        "trainer": Proc("trainer", [py, "-m", "t1.cli.trainer", "--config", str(config), "--port", str(t_port)],
                        root / "trainer.log", root, r"listening on \S+:\d+"),
        "inference": Proc("inference", [py, "-m", "t1.cli.inference", "--config", str(config), "--port", str(i_port)],
                          root / "inference.log", root, r"listening on \S+:\d+"),
        "coordinator": Proc("coordinator", [py, "-m", "t1.cli.coordinator", "--config", str(config)],
                            root / "coordinator.log", root, None),
    }
    rng = random.Random(seed)
    order = rng.sample(sorted(procs), 3)
    run_dir = root / "run"
    buffer = root / "trainer" / "buffer.sqlite"
    try:
        for name in ("trainer", "inference", "coordinator"):
            procs[name].start()
        wait_until(lambda: any(e["event"] == "start" for e in _events(run_dir)), 300, "the coordinator")
        for i, victim in enumerate(order):
            # Each kill after the run made progress since the one before (two more trajectories at the trainer).
            wait_until(lambda i=i: buffer.exists() and len(accepted_ids(buffer)) >= 2 * (i + 1), 400,
                       "trajectories at the trainer")
            time.sleep(rng.uniform(0.5, 8.0))  # a seeded moment: mid-episode, mid-step or mid-push
            assert not (run_dir / "report.json").exists(), f"the run finished before {victim}'s kill: raise MAX_STEPS"
            procs[victim].kill9()
            time.sleep(rng.uniform(0.0, 3.0))
            procs[victim].start()
        coord = procs["coordinator"].proc
        assert coord is not None
        rc = coord.wait(900)
    finally:
        for name in ("coordinator", "trainer", "inference"):
            procs[name].stop()
        print(f"seed {seed}: kill order {order}")  # shown with the logs' tails when the test fails
        for name in procs:
            print(f"--- {name}.log\n{procs[name].log.read_text(errors='replace')[-3000:]}")
    log = (root / "coordinator.log").read_text(errors="replace")
    assert rc == 0, log[-5000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["trainer"]["stage"] == "done" and report["trainer"]["step"] == MAX_STEPS, report["trainer"]
    steps = trained_steps(buffer)
    assert [s for s, _ in steps] == list(range(1, MAX_STEPS + 1)), "no step lost or computed twice"
    trained = [tid for _, ids in steps for tid in ids]
    assert len(trained) == len(set(trained)), "no trajectory trained twice"
    assert set(trained) <= accepted_ids(buffer), "only accepted trajectories are trained"
    assert "UNIQUE constraint" not in (root / "trainer.log").read_text(errors="replace")
    # The trainer link's stream broke during each outage: nothing of grpc's call machinery may fail under it.
    assert "asynchronous generator is already running" not in log and "Fatal Python error" not in log
    assert not processes_under(root), f"left behind: {processes_under(root)}"
    # Episodes live at the coordinator's kill -9 were journaled turn by turn: its restart resumed each one in its
    # sandbox (the run's sandbox service outlives the coordinator) or ended it as infra_error from its journal,
    # none damaged, and no journal outlives the run.
    recovered = [e for e in _events(run_dir) if e["event"] == "journal_recovered"]
    assert all(e["damaged"] == 0 and e["infra_errors"] + e["resumable"] + e["already_spooled"] == e["episodes"]
               for e in recovered), recovered
    assert not list((run_dir / "journal").glob("*.journal")), "a journal outlived its episode"
    print(f"seed {seed}: journal_recovered {recovered}")
