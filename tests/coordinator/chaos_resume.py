"""Chaos of issue 41: kill -9 of the coordinator at seeded moments of a training run whose episodes last 40 turns;
the restarted coordinator resumes them from their last journaled turn in their sandboxes.

Each turn of the task's scripted solution depends on the shell state the turn before left (its directory and an
exported variable) and writes a marker only when it finds it: the verifier passes only if every resume restored
the shell, in the same sandbox. After the run: the trajectories the trainer took equal, up to each resume point,
the replay of the journal the dead coordinator left (ids, logprobs, mask, versions, routing, turn spans); no
trajectory is trained twice; turns lost <= 1 per resumed episode; TITO drift 0; nothing left running."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import socket
import sqlite3
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from chaos import accepted_ids, processes_under, trained_steps, wait_until
from test_chaos_train import Proc

from t1.agent.resume_point import resume_point
from t1.coordinator.spool.journal import read_frames
from t1.tito.buffer import build_segments
from t1.tito.replay import replay
from t1.trajectory.serialization import decode_trajectory

TURNS = 40
MAX_STEPS = 3


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _chain_task(root: Path, name: str) -> Path:
    """A task of TURNS scripted turns, each needing the directory and STEP variable the turn before left."""
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "solution").mkdir()
    (d / "task.toml").write_text(f'version = "1.0"\n[task]\nname = "{name}"\n[agent]\ntimeout_sec = 900\n'
                                 '[verifier]\ntimeout_sec = 60\n[environment]\nworkdir = "/app"\n'
                                 'allow_internet = false\n')
    (d / "instruction.md").write_text(f"Leave step-1 .. step-{TURNS} in /app/w, each made in turn.\n")
    turns = ["mkdir -p /app/w && cd /app/w && export STEP=1 && touch step-1"]
    turns += [f'sleep 0.3; [ "$PWD" = /app/w ] && [ "$STEP" = {i - 1} ] && touch step-{i}; export STEP={i}'
              for i in range(2, TURNS + 1)]
    (d / "solution" / "turns.txt").write_text("\n".join(turns) + "\n")
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\n" + "\n".join(turns) + "\n")
    (d / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\nok=1\n"
        f"for i in $(seq 1 {TURNS}); do [ -e /app/w/step-$i ] || ok=0; done\necho $ok > /logs/verifier/reward.txt\n")
    return d


def _config(root: Path, model_dir: Path, sandbox: dict, trainer_port: int) -> dict:
    return {
        "name": "resume-chaos",
        "sandbox": {**sandbox, "pool": {"max_sandboxes": 4}},
        "tasks": {"sets": {"train": {"path": str(root / "tasks"), "split": "train"}}, "train": ["train"], "eval": []},
        "rollout": {"policy": "oracle_script", "max_turns": TURNS + 5, "max_context_tokens": 32768, "group_size": 2,
                    "max_concurrent_episodes": 4, "sampling": {"max_tokens": 256}},
        "reward": {"mode": "count"},
        "inference": {"model": {"path": str(model_dir)}, "pool": {"num_local_servers": 0}},
        "trainer": {"endpoint": f"127.0.0.1:{trainer_port}", "work_dir": str(root / "trainer"),
                    "max_steps": MAX_STEPS, "warm_start": {},
                    "rl": {"groups_per_step": 1, "max_policy_lag": 4, "token_budget": 65536}},
        "coordinator": {"run_dir": str(root / "run"), "server": {"port": 0}, "shutdown_grace_s": 5,
                        "eval": {"before_training": False}},
        "metrics": {"port": 0},
    }


def _live_turns(journal_dir: Path) -> int:
    """The most completed turns of a live episode's journal (0 when none is live)."""
    best = 0
    for path in journal_dir.glob("*.journal"):
        with contextlib.suppress(OSError):
            best = max(best, sum(1 for (kind, _), _ in read_frames(path) if kind == "turn"))
    return best


def _check_prefix(snapshot: Path, payloads: dict[str, bytes]) -> int:
    """The accepted trajectory of the snapshot's episode equals, up to its resume point, the journal's replay;
    the turns compared (0 when the episode was not accepted)."""
    frames = read_frames(snapshot)
    point = resume_point(frames)
    if point.episode_id not in payloads or point.turns == 0:
        return 0
    kept = [e for e, end in frames if end <= point.keep_bytes]
    expected = build_segments(replay(kept).builders)
    got = decode_trajectory(payloads[point.episode_id]).segments
    assert len(got) >= len(expected)
    for want, seg in zip(expected, got, strict=False):
        n = len(want.token_ids)
        for field in ("token_ids", "logprobs", "loss_mask", "policy_versions"):
            assert np.array_equal(getattr(seg, field)[:n], getattr(want, field), equal_nan=True), field
        assert (want.routing is None) == (seg.routing is None)
        if want.routing is not None:
            assert np.array_equal(seg.routing[:n], want.routing)
        assert [(t.start, t.end) for t in seg.turns[:len(want.turns)]] == [(t.start, t.end) for t in want.turns]
    return point.turns


def run_resume_chaos(root: Path, model_dir: Path, sandbox: dict, seed: int) -> None:
    """A training run of 40-turn chain episodes whose coordinator is killed with -9 twice at seeded moments (each
    restarted at once), and the checks of the module docstring."""
    root.chmod(0o711)
    for i in range(2):
        _chain_task(root / "tasks", f"chain-{i}")
    t_port = _port()
    config = root / "chaos.yaml"
    config.write_text(yaml.safe_dump(_config(root, model_dir, sandbox, t_port)))
    py = sys.executable
    trainer = Proc("trainer", [py, "-m", "t1.cli.trainer", "--config", str(config), "--port", str(t_port)],
                   root / "trainer.log", root, r"listening on \S+:\d+")
    coordinator = Proc("coordinator", [py, "-m", "t1.cli.coordinator", "--config", str(config)],
                       root / "coordinator.log", root, None)
    rng = random.Random(seed)
    run_dir, buffer = root / "run", root / "trainer" / "buffer.sqlite"
    snapshots: list[Path] = []
    try:
        trainer.start()
        coordinator.start()
        for kill in range(2):
            at = rng.randint(3, TURNS - 8)
            wait_until(lambda at=at: _live_turns(run_dir / "journal") >= at, 600, f"a live episode at turn {at}")
            time.sleep(rng.uniform(0.0, 0.6))  # a seeded moment inside a turn: generating, running, probing
            coordinator.kill9()
            snap = root / f"snapshot-{kill}"
            shutil.copytree(run_dir / "journal", snap)
            snapshots.extend(sorted(snap.glob("*.journal")))
            coordinator.start()
        assert coordinator.proc is not None
        rc = coordinator.proc.wait(1200)
    finally:
        coordinator.stop()
        trainer.stop()
        print(f"--- coordinator.log\n{(root / 'coordinator.log').read_text(errors='replace')[-4000:]}")
    log = (root / "coordinator.log").read_text(errors="replace")
    assert rc == 0, log[-5000:]
    report = json.loads((run_dir / "report.json").read_text())
    rollouts = report["rollouts"]
    assert report["trainer"]["step"] == MAX_STEPS, report["trainer"]
    # Counted by the last coordinator only (each process reports its own): it resumed what the last kill left.
    assert rollouts["resumed"] >= 1 and rollouts["resume_failed"] == 0, rollouts
    assert rollouts["resume_turns_lost"] <= rollouts["resumed"], rollouts
    assert report["fidelity"]["t1_tito_drift_tokens"] == 0
    steps = trained_steps(buffer)
    trained = [tid for _, ids in steps for tid in ids]
    assert len(trained) == len(set(trained)), "no trajectory trained twice"
    assert set(trained) <= accepted_ids(buffer)
    with sqlite3.connect(buffer) as con:
        payloads = {str(i): bytes(p) for i, p in con.execute("SELECT id, payload FROM trajectories")}
    compared = sum(_check_prefix(s, payloads) for s in snapshots)
    assert compared > 0, "no resumed episode reached the trainer"
    for payload in payloads.values():  # every episode finished with its shell chain whole, resumed or not
        traj = decode_trajectory(payload)
        assert traj.status.value == "ok" and traj.reward == 1.0, (traj.id, traj.status, traj.reward)
    assert not processes_under(root), f"left behind: {processes_under(root)}"
    print(f"seed {seed}: {rollouts}; {compared} journaled turns compared")
