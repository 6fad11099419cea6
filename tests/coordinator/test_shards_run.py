"""Issue 22's acceptance run, slow: 2 coordinator processes (shards 0 and 1 of the training tasks), 1 trainer
and 2 inference servers that follow the trainer's versions, all real processes on loopback with the
tiny model. Shard 1 is killed with kill -9 mid-run and kept down while shard 0 goes on, then restarted
on its run dir. After the run: groups of both shards were trained, no step lost or computed twice, no
trajectory trained twice, everything shard 1 had spooled reached the trainer, each version was loaded
at most once per server (the coordinators load nothing) and both servers reached the last version."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from chaos import accepted_ids, processes_under, trained_steps, wait_until
from test_chaos_train import Proc, _events, _port
from test_local_run import root, small_config  # noqa: F401  (root is a fixture)

from t1.coordinator.spool.spool_recovery import scan_segment
from t1.trajectory.spool_files import decode_record, list_segments, segment_path

MAX_STEPS = 4


def _shard(trajectory_id: str) -> int | None:
    m = re.search(r"-s(\d)-[0-9a-f]{10}-a\d+$", trajectory_id)
    return int(m.group(1)) if m else None


def _spooled(run_dir: Path) -> set[str]:
    """Every trajectory id in the spool's segments (read-only)."""
    spool = run_dir / "spool"
    ids = set()
    for index in list_segments(spool):
        path = segment_path(spool, index)
        ids |= {decode_record(body, path)[0] for _, body in scan_segment(path).frames}
    return ids


def _loads(log: Path) -> list[int]:
    return [int(v) for v in re.findall(r"loaded weights v(\d+) from", log.read_text(errors="replace"))]


@pytest.mark.slow  # five services on 2 cores, a kill and a restart: a few minutes
@pytest.mark.timeout(1500)
def test_two_shards_one_trainer_two_servers_survive_a_dead_shard(root: Path, tiny_model_dir: Path) -> None:  # noqa: F811
    t_port, i_ports = _port(), [_port(), _port()]
    trainer_at = f"127.0.0.1:{t_port}"
    base = small_config(root, tiny_model_dir, max_steps=MAX_STEPS)
    base["tasks"]["sets"]["train"]["synth"] = 4
    base["tasks"]["eval"] = []
    base["trainer"]["endpoint"] = trainer_at
    base["trainer"]["warm_start"] = {}
    base["trainer"]["rl"].update(max_policy_lag=2, groups_per_step=2)
    base["inference"]["server"]["follow_trainer"] = trainer_at
    base["inference"]["pool"] = {"endpoints": [f"127.0.0.1:{p}" for p in i_ports], "request_timeout_s": 120,
                                 "weights": "follow", "weights_timeout_s": 300}
    base["coordinator"]["eval"]["before_training"] = False
    py = sys.executable
    shared = root / "services.yaml"
    shared.write_text(yaml.safe_dump(base))
    procs = {"trainer": Proc("trainer", [py, "-m", "t1.cli.trainer", "--config", str(shared), "--port", str(t_port)],
                             root / "trainer.log", root, r"listening on \S+:\d+")}
    for i, port in enumerate(i_ports):
        procs[f"inference-{i}"] = Proc(f"inference-{i}", [py, "-m", "t1.cli.inference", "--config", str(shared),
                                                          "--port", str(port)],
                                       root / f"inference-{i}.log", root, r"listening on \S+:\d+")
    run_dirs = []
    for i in range(2):
        cfg = yaml.safe_load(yaml.safe_dump(base))
        cfg["coordinator"]["run_dir"] = str(root / f"c{i}/run")
        cfg["coordinator"]["shard"] = {"index": i, "count": 2}
        cfg["sandbox"]["local"]["root"] = str(root / f"c{i}/sandboxes")
        cfg["tasks"]["sets"]["train"]["path"] = str(root / f"c{i}/tasks/train")  # the same synth seed: same ids
        path = root / f"coordinator-{i}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        run_dirs.append(root / f"c{i}/run")
        procs[f"coordinator-{i}"] = Proc(f"coordinator-{i}", [py, "-m", "t1.cli.coordinator", "--config", str(path)],
                                         root / f"coordinator-{i}.log", root, None)
    buffer = root / "trainer" / "buffer.sqlite"

    def by_shard(shard: int) -> set[str]:
        return {t for t in accepted_ids(buffer) if _shard(t) == shard} if buffer.exists() else set()

    try:
        for name in ("trainer", "inference-0", "inference-1", "coordinator-0", "coordinator-1"):
            procs[name].start()
        for d in run_dirs:
            wait_until(lambda d=d: any(e["event"] == "start" for e in _events(d)), 300, f"coordinator {d}")
        wait_until(lambda: len(by_shard(1)) >= 2 and len(by_shard(0)) >= 1, 600, "trajectories of both shards")
        procs["coordinator-1"].kill9()
        spooled_by_1 = _spooled(run_dirs[1])
        steps_at_kill, zero_at_kill = len(trained_steps(buffer)), len(by_shard(0))
        # Shard 1 stays down: shard 0 must keep feeding the trainer, and the trainer keep stepping.
        wait_until(lambda: len(by_shard(0)) >= zero_at_kill + 2 and len(trained_steps(buffer)) > steps_at_kill,
                   600, "shard 0 and the trainer going on while shard 1 is dead")
        procs["coordinator-1"].start()
        rcs = [procs[f"coordinator-{i}"].proc.wait(900) for i in range(2)]  # type: ignore[union-attr]
        for i in range(2):  # the servers follow the trainer to its last version by themselves
            wait_until(lambda i=i: MAX_STEPS in _loads(root / f"inference-{i}.log"), 120, f"inference-{i} at "
                                                                                          f"v{MAX_STEPS}")
    finally:
        for name in ("coordinator-0", "coordinator-1", "trainer", "inference-0", "inference-1"):
            procs[name].stop()
        for name, p in procs.items():
            print(f"--- {name}.log\n{p.log.read_text(errors='replace')[-3000:]}")
    assert rcs == [0, 0], rcs
    steps = trained_steps(buffer)
    assert [s for s, _ in steps] == list(range(1, MAX_STEPS + 1)), "no step lost or computed twice"
    trained = [tid for _, ids in steps for tid in ids]
    assert len(trained) == len(set(trained)), "no trajectory trained twice"
    accepted = accepted_ids(buffer)
    assert set(trained) <= accepted
    assert {_shard(t) for t in trained} == {0, 1}, "the trainer's batches hold groups of both shards"
    assert spooled_by_1 <= accepted, f"lost from shard 1's spool: {sorted(spooled_by_1 - accepted)[:5]}"
    for i in range(2):
        loads = _loads(root / f"inference-{i}.log")
        assert len(loads) == len(set(loads)) and loads == sorted(loads), f"inference-{i} loaded {loads}"
        assert loads[-1] == MAX_STEPS
    for i in range(2):
        assert "UpdateWeights" not in (root / f"inference-{i}.log").read_text(errors="replace"), "nothing pushed"
    assert not processes_under(root), f"left behind: {processes_under(root)}"
