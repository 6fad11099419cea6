"""Trackers: TensorBoard event files and a W&B offline run from the session's smoke run, read back with
the tensorboard package's own reader; the registry snapshot's tags by hand; a failing sink is dropped."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from smoke_run import SMOKE_TIMEOUT, SmokeRun
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from t1.config.shared import MetricsConfig
from t1.metrics.runlog import RunLog
from t1.metrics.trackers import Trackers, open_trackers, registry_scalars

# docs/design.md, "Metrics": every name must reach the trackers.
DESIGN_NAMES = (
    "t1_train_infer_logprob_abs_diff", "t1_tito_drift_tokens", "t1_tito_repaired_turns",
    "t1_retokenize_mismatch_rate", "t1_routing_replay_coverage", "t1_router_disagreement_rate",
    "t1_rollout_turns", "t1_rollout_turns_per_second", "t1_turn_latency_seconds", "t1_active_episodes",
    "t1_infra_failure_rate", "t1_event_loop_lag_seconds", "t1_episode_reward", "t1_resolve_rate", "t1_policy_lag",
    "t1_kl", "t1_clip_fraction", "t1_value_loss", "t1_explained_variance",
)


def _scalars(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


@SMOKE_TIMEOUT
def test_tensorboard_events_of_the_smoke_run_hold_every_design_metric(smoke_run: SmokeRun) -> None:
    assert smoke_run.rc == 0, smoke_run.log[-4000:]
    acc = _scalars(smoke_run.run_dir)
    tags = set(acc.Tags()["scalars"])
    missing = [n for n in DESIGN_NAMES if not any(t == n or t.startswith(n + "/") for t in tags)]
    assert not missing, f"not in the event files: {missing}; tags: {sorted(tags)}"
    # x is the trainer step: it reaches the last step, and never goes back
    with sqlite3.connect(f"file:{smoke_run.trainer_dir / 'buffer.sqlite'}?mode=ro", uri=True) as db:
        steps = {s: json.loads(mx) for s, mx in db.execute("SELECT step, metrics FROM steps")}
    points = acc.Scalars("t1_rollout_turns")
    xs = [p.step for p in points]
    assert xs == sorted(xs) and xs[-1] == max(steps), xs
    # wall time is the run log's: every point lies within the run
    events = smoke_run.events()
    assert all(events[0]["ts"] - 1 <= p.wall_time <= events[-1]["ts"] + 1 for p in points)
    # the PPO step's values arrive as the trainer measured them (mirrored gauge and raw trainer/ tag)
    ppo = max(s for s, mx in steps.items() if "clip_fraction" in mx)
    for tag, key in (("t1_router_disagreement_rate", "t1_router_disagreement_rate"),
                     ("trainer/entropy", "entropy")):
        at_step = [p.value for p in acc.Scalars(tag) if p.step == ppo]
        assert at_step and at_step[-1] == pytest.approx(steps[ppo][key], rel=1e-5), (tag, at_step, steps[ppo][key])
    # counters only grow, and the last value is what the run did
    turns = [p.value for p in points]
    assert turns == sorted(turns) and turns[-1] > 0


def test_wandb_offline_run_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B as the coordinator drives it: the run log's records, the real registry, offline (no network)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    from t1.metrics import registry as m

    cfg = MetricsConfig(trackers=["wandb"], tags=["smoke"])
    trackers = open_trackers(cfg, tmp_path, "local-small", {"name": "local-small", "seed": 3})
    assert trackers is not None
    log = RunLog(tmp_path / "run.jsonl", trackers)
    m.set_trainer_metrics({"kl": 0.25})
    log.write("status", stage="training", trainer_step=0)
    log.write("trainer", step=1, metrics={"kl": 0.25, "entropy": 4.5})
    log.close()  # finishes the W&B run
    runs = list((tmp_path / "wandb").glob("wandb/offline-run-*"))
    assert len(runs) == 1, runs
    data = list(runs[0].glob("run-*.wandb"))
    assert len(data) == 1 and data[0].stat().st_size > 0
    blob = data[0].read_bytes()
    for needle in (b"t1_kl", b"t1_episode_reward", b"trainer/entropy", b"trainer/step", b"local-small", b"smoke"):
        assert needle in blob, f"{needle!r} is not in the W&B run file"


def test_registry_scalars_tags_by_hand() -> None:
    reg = CollectorRegistry()
    Gauge("t1_g", "g", registry=reg).set(0.5)
    Gauge("t1_lab", "l", ["split"], registry=reg).labels(split="after:heldout").set(0.25)
    Counter("t1_c", "c", registry=reg).inc(3)
    h = Histogram("t1_h", "h", ["part"], buckets=(1, 10), registry=reg)
    h.labels(part="gen").observe(2.0)
    h.labels(part="gen").observe(4.0)
    Gauge("other_g", "not ours", registry=reg).set(9)
    Gauge("t1_nan", "nan", registry=reg).set(float("nan"))
    assert registry_scalars(reg) == {"t1_g": 0.5, "t1_lab/split=after:heldout": 0.25, "t1_c": 3.0,
                                     "t1_h/part=gen/count": 2.0, "t1_h/part=gen/mean": 3.0}


class _Sink:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.points: list[tuple[dict, int, float]] = []
        self.closed = False

    def log(self, scalars, step, wall_time) -> None:
        if self.fail:
            raise OSError("disk full")
        self.points.append((dict(scalars), step, wall_time))

    def close(self) -> None:
        self.closed = True


def test_trackers_follow_the_run_log_and_drop_a_failing_sink(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    g = Gauge("t1_kl", "kl", registry=reg)
    good, bad = _Sink(), _Sink(fail=True)
    log = RunLog(tmp_path / "run.jsonl", Trackers([good, bad], registry=reg))
    log.write("start", name="x")  # not a point
    g.set(0.1)
    log.write("status", stage="training", trainer_step=0)
    log.write("trainer", step=2, metrics={"kl": 0.1, "entropy": 4.5, "explained_variance": None})
    g.set(0.2)
    log.write("status", stage="training", trainer_step=1)  # a stale poll never moves the step back
    log.close()
    assert [(p[1], p[0]["t1_kl"]) for p in good.points] == [(0, 0.1), (2, 0.1), (2, 0.2)]
    assert good.points[1][0]["trainer/entropy"] == 4.5 and "trainer/explained_variance" not in good.points[1][0]
    records = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert [p[2] for p in good.points] == [r["ts"] for r in records if r["event"] != "start"]
    assert good.closed and not bad.points


def test_no_trackers_configured_imports_neither(tmp_path: Path) -> None:
    assert open_trackers(MetricsConfig(), tmp_path, "x") is None
    code = ("import sys; import t1.coordinator.run.parts, t1.metrics.trackers; "
            "print(sorted(m for m in ('wandb', 'tensorboard', 'torch.utils.tensorboard') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / "wandb").exists()


def test_bad_tracker_config_and_missing_package_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from t1.config import ConfigError, validate
    with pytest.raises(ConfigError) as err:
        validate({"metrics": {"trackers": ["tensorboard", "mlflow"]}})
    assert "metrics.trackers[1]" in str(err.value) and "mlflow" in str(err.value)
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    with pytest.raises(RuntimeError, match="'wandb' but the wandb package is not installed"):
        open_trackers(MetricsConfig(trackers=["wandb"]), tmp_path, "x")
