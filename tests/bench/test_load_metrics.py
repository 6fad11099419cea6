"""The load benchmark's bookkeeping: turn overhead accounting, percentiles and the per-scale summary."""

from __future__ import annotations

import math

import pytest

from bench.load import metrics as load_metrics
from bench.load.metrics import TurnClock, percentiles
from bench.load.report import scale_result


def test_turn_overhead_is_wall_minus_model_and_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(load_metrics.time, "monotonic", lambda: now[0])
    clock = TurnClock()
    clock.generate_started("a")          # turn 1 of a starts at 100.0
    clock.model("a", 4.0)
    clock.command("a", 0.5)
    clock.command("a", 0.25)             # two commands in one turn
    now[0] = 104.8
    clock.generate_started("a")          # turn 2 starts: 4.8 s wall, 4.75 s model + commands
    clock.generate_started("b")          # another episode's first turn adds no sample
    assert clock.overhead_s == [pytest.approx(0.05)]
    assert clock.generations == 1 and clock.command_s == [0.5, 0.25]
    clock.reset_samples()
    assert clock.overhead_s == [] and clock.generations == 0
    clock.end("a")
    now[0] = 200.0
    clock.generate_started("a")          # a fresh start after end(): no sample from the old clock
    assert clock.overhead_s == []


def test_percentiles_and_empty() -> None:
    p = percentiles([0.001 * i for i in range(1, 101)])
    assert p["p50"] == pytest.approx(0.0505) and p["max"] == pytest.approx(0.1)
    assert all(math.isnan(v) for v in percentiles([]).values())


def test_scale_result_divides_by_turns_live_episodes_and_tokens() -> None:
    clock = TurnClock()
    out = scale_result(
        episodes=10, live_at_start=10, live_at_end=8, ramp_s=1.0, window_s=10.0, turns=100,
        cpu0={"coordinator": 1.0, "sim_inference": 0.0, "sandbox_host": 0.0},
        cpu1={"coordinator": 1.05, "sim_inference": 0.2, "sandbox_host": 0.1}, clock=clock,
        lag_s=[0.001] * 99 + [0.5], rss_base=100 << 20, rss_end=(100 << 20) + 8 * 150 * 1024 + 4096,
        live_traj_bytes=4096, spooled=[(397_000, 1000, 0.01), (794_000, 2000, 0.01)], stop_s=1.0, errors=[],
        raw_bytes_per_token=392)
    assert out["cpu_ms_per_turn"]["coordinator"] == pytest.approx(0.5)
    assert out["turns_per_s"] == 10.0
    assert out["rss_per_live_episode_kb"] == pytest.approx(150.0)
    assert out["rss_per_live_episode_kb_whole"] == pytest.approx(150.5)  # nothing subtracted
    assert out["trajectory_bytes_per_token"] == pytest.approx(397.0)
    assert out["targets"] == {"loop_lag_p99_under_100ms": True, "coordinator_cpu_per_turn_under_1ms": True,
                              "rss_per_live_episode_under_200kb": True, "trajectory_bytes_within_10pct_of_raw": True,
                              "whole_rss_per_live_episode_at_most_256kb": True}
    finished = scale_result(**{**dict(
        episodes=10, live_at_start=10, ramp_s=1.0, window_s=10.0, turns=100, cpu0={"coordinator": 0.0},
        cpu1={"coordinator": 0.5}, clock=clock, lag_s=[0.2] * 10, rss_base=0, rss_end=0, live_traj_bytes=0,
        spooled=[], stop_s=0.0, errors=[], raw_bytes_per_token=392), "live_at_end": 0})
    assert finished["targets"]["rss_per_live_episode_under_200kb"] is None
    assert finished["targets"]["whole_rss_per_live_episode_at_most_256kb"] is None
    assert finished["targets"]["coordinator_cpu_per_turn_under_1ms"] is False
    assert finished["targets"]["loop_lag_p99_under_100ms"] is False


def test_shard_totals_weigh_cpu_by_turns() -> None:
    from bench.load.shards import combine

    def shard(turns: int, cpu: float, lag: float) -> dict:
        return {"episodes": 100, "turns": turns, "turns_per_s": turns / 10, "cpu_ms_per_turn": {"coordinator": cpu},
                "cpu_cores_used": {"coordinator": cpu * turns / 1e4}, "loop_lag_ms": {"p99": lag}, "num_errors": 0}

    total = combine(2, [shard(100, 1.0, 5.0), shard(300, 2.0, 9.0)])
    assert total["coordinator_cpu_ms_per_turn"] == 1.75 and total["turns_per_s"] == 40.0
    assert (total["episodes"], total["loop_lag_p99_ms_worst"], total["coordinator_cores"]) == (200, 9.0, 0.07)


def test_ablation_variants_and_medians() -> None:
    from bench.load.ablate import VARIANTS, parse_variants, summarise

    assert parse_variants("full,floor") == {"full": [], "floor": VARIANTS["floor"].split()}
    assert parse_variants("a=;b=--no-journal --layers 1") == {"a": [], "b": ["--no-journal", "--layers", "1"]}
    with pytest.raises(ValueError, match="unknown variant 'journal-off'"):
        parse_variants("full,journal-off")

    def run(cpu: float, errors: int = 0) -> dict:
        return {"cpu_ms_per_turn": cpu, "turns_per_s": 600.0, "loop_lag_p99_ms": 50.0,
                "rss_per_live_episode_kb": 200.0, "num_errors": errors}

    rows = summarise({"full": [run(1.5), run(1.4), run(1.9)], "floor": [run(1.0), run(1.2, errors=2)]})
    assert [r["variant"] for r in rows] == ["full", "floor"]
    assert rows[0]["cpu_ms_per_turn"] == 1.5 and rows[0]["minus_reference_ms"] == 0.0
    assert rows[1]["cpu_ms_per_turn"] == 1.1 and rows[1]["minus_reference_ms"] == -0.4 and rows[1]["errors"] == 2
    assert rows[1]["cpu_ms_per_turn_runs"] == [1.0, 1.2]
    # a quick run ends with no live episode: no RSS per live episode to take the median of
    (quick,) = summarise({"quick": [{**run(2.0), "rss_per_live_episode_kb": None}]})
    assert quick["rss_per_live_episode_kb"] is None and quick["loop_lag_p99_ms"] == 50.0
