"""The one-command local run at small scale: t1-coordinator starts the torch inference server and the
DeepSpeed (CPU) trainer as children, synthesizes task sets, writes oracle demonstrations, evaluates,
warm-starts, evaluates the warm start, runs PPO, evaluates again and reports; and SIGTERM mid-training ends it cleanly,
with exit 128 + SIGTERM and a last line that says where it stopped (a run that did not finish never says "done").
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from smoke_run import SMOKE_TIMEOUT, SmokeRun, small_config
from smoke_run import start_coordinator as _start

from t1.coordinator.spool.trajectory_spool import Spool


@pytest.fixture()
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="t1-local-run-"))
    path.chmod(0o711)  # sandbox users must traverse to their trees
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "run.jsonl").read_text().splitlines()]


@SMOKE_TIMEOUT
def test_local_run_end_to_end_small(smoke_run: SmokeRun) -> None:
    # The session's shared smoke run (tests/conftest.py), with the trackers on: they change nothing here.
    root, log = smoke_run.root, smoke_run.log
    assert smoke_run.rc == 0, log[-6000:]
    report = json.loads((root / "run" / "report.json").read_text())
    # The three evals (base, warm start after SFT, RL after PPO) ran on the held-out set through eval jobs;
    # infra errors are counted, never scored.
    for label in ("base", "warm_start", "rl"):
        assert report[label]["heldout"]["num_tasks"] == 1, report
        assert 0.0 <= report[label]["heldout"]["resolve_rate"] <= 1.0
    assert report["sft_curve"] == []  # SFT not steered here: its one step, no validation evals
    # Warm start (1 SFT + 1 critic step) and one PPO step; the trainer is done.
    assert report["trainer"]["stage"] == "done" and report["trainer"]["step"] == 3, report["trainer"]
    assert report["trainer"]["policy_version"] >= 1
    fid = report["fidelity"]
    assert fid["t1_tito_drift_tokens"] == 0
    assert fid["t1_train_infer_logprob_abs_diff"] >= 0.0 and "t1_router_disagreement_rate" in fid
    assert 0.0 <= fid["t1_retokenize_mismatch_rate"] <= 1.0
    # Weight sync: each published version was loaded on the inference server before training rollouts
    # used it, and the tokens of training rollouts carry those versions.
    events = _events(root / "run")
    loaded = [e["version"] for e in events if e["event"] == "weights"]
    assert loaded == sorted(loaded) and loaded and loaded[-1] == report["trainer"]["policy_version"]
    versions = report["rollouts"]["policy_versions"]
    assert versions and set(versions) <= {0, *loaded}
    assert (root / "run" / "demos.msgpack").stat().st_size > 0, "oracle demonstrations for SFT"
    assert (root / "tasks" / "train").is_dir() and (root / "tasks" / "heldout").is_dir()
    assert "held-out solve rate" in log and "t1_train_infer_logprob_abs_diff" in log
    assert events[-1]["event"] == "stop"
    transcripts = list((root / "run" / "transcripts" / "train").rglob("*.md"))
    assert transcripts, "readable per-episode transcripts"


@pytest.mark.slow  # a second full stack start: about two minutes here
def test_sigterm_during_training_drains_and_says_it_stopped(root: Path, tiny_model_dir: Path) -> None:
    cfg = small_config(root, tiny_model_dir, max_steps=50)
    cfg["coordinator"]["eval"]["before_training"] = False
    proc, out = _start(root, cfg)
    try:
        deadline = time.monotonic() + 480
        run_log = root / "run" / "run.jsonl"
        while not (run_log.is_file() and '"stage":"training"' in run_log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text(errors="replace")[-4000:]
            time.sleep(1)
        time.sleep(10)  # episodes in flight
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(120)  # grace (5 s) + child stops; a hang fails here
    finally:
        if proc.poll() is None:
            proc.kill()
    log = out.read_text(errors="replace")
    assert rc == 128 + signal.SIGTERM, log[-4000:]
    assert "stopped by SIGTERM before its end (phase training, trainer step" in log and " done" not in log, log[-4000:]
    events = _events(root / "run")
    assert events[-1]["event"] == "stop"
    # the children's stop lines are detail: the run's log file has them, the terminal does not
    assert "trainer stopped (exit 0)" in (root / "run" / "logs" / "coordinator.log").read_text(errors="replace")
    # The spool was closed cleanly: it reopens with exactly what the coordinator said was still pending.
    spool = Spool.open(root / "run" / "spool", 1 << 30, 1 << 20, fsync=False)
    assert spool.pending_count == events[-1]["spool_pending"]
    spool.close()
