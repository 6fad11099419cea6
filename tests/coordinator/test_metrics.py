"""Metrics: every docs/design.md name on /metrics (real HTTP), the JSONL run log, and the loop-lag watchdog."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import t1.tito.buffer  # noqa: F401 - registers the TITO counters on the default registry (bridged)
from t1.metrics import registry as m
from t1.metrics.http import start_metrics_server
from t1.metrics.runlog import RunLog
from t1.metrics.watchdog import LagWatchdog

DESIGN_NAMES = [
    "t1_train_infer_logprob_abs_diff", "t1_tito_drift_tokens", "t1_tito_repaired_turns",
    "t1_retokenize_mismatch_rate", "t1_routing_replay_coverage", "t1_router_disagreement_rate",
    "t1_rollout_turns", "t1_rollout_turns_per_second", "t1_turn_latency_seconds", "t1_active_episodes",
    "t1_infra_failure_rate", "t1_event_loop_lag_seconds", "t1_episode_reward", "t1_resolve_rate", "t1_policy_lag",
    "t1_kl", "t1_clip_fraction", "t1_value_loss", "t1_explained_variance",
]


def test_every_design_metric_is_served_once() -> None:
    m.set_trainer_metrics({"t1_kl": 0.25, "loss/clip_fraction": 0.125, "unknown": 1.0})
    server = start_metrics_server("127.0.0.1", 0)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read().decode()
    finally:
        server.stop()
    types = [line.split()[2].removesuffix("_total") for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), "a family is exposed twice"
    for name in DESIGN_NAMES:
        assert name in types, name
    assert "t1_kl 0.25" in text and "t1_clip_fraction 0.125" in text


def test_run_log_is_one_json_object_per_line(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "logs" / "run.jsonl")
    log.write("status", turns=3, rate=float("nan"), path=tmp_path, nested={"a": [1.5, float("inf")]})
    log.write("stop")
    log.close()
    log.write("ignored-after-close")
    lines = (tmp_path / "logs" / "run.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["event"] for r in records] == ["status", "stop"]
    assert records[0]["rate"] is None and records[0]["nested"] == {"a": [1.5, None]}
    assert records[0]["path"] == str(tmp_path) and isinstance(records[0]["ts"], float)
    json.dumps(records)


def _blocking_callback() -> None:
    time.sleep(0.4)  # the stall the watchdog must name


async def test_watchdog_names_the_blocking_callback() -> None:
    dog = LagWatchdog(warn_s=0.1, interval_s=0.02)
    dog.start()
    await asyncio.sleep(0.1)
    asyncio.get_running_loop().call_soon(_blocking_callback)
    await asyncio.sleep(0.2)
    await dog.stop()
    assert dog.max_lag_s >= 0.3
    worst = dog.stalls[0]
    assert worst.lag_s >= 0.3
    assert any("_blocking_callback" in w and "test_metrics.py" in w for w in worst.where), worst.where
