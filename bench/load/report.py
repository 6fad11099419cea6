"""The load benchmark's numbers per scale (pure: measurements in, a JSON-ready dict out) and its rich table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from bench.load.metrics import TurnClock, percentiles

# Targets of issue 9 on the 2-core machine.
TARGET_LAG_P99_MS = 100.0
TARGET_CPU_PER_TURN_MS = 1.0
TARGET_RSS_PER_EPISODE_KB = 200.0
TARGET_WHOLE_RSS_PER_EPISODE_KB = 256.0  # issue 41: everything a live episode costs, at any turn
TARGET_BYTES_RATIO = 1.10


def _ms(values: dict[str, float]) -> dict[str, float]:
    return {k: round(v * 1e3, 3) for k, v in values.items()}


def scale_result(*, episodes: int, live_at_start: int, live_at_end: int, ramp_s: float, window_s: float,
                 turns: int, cpu0: dict[str, float], cpu1: dict[str, float], clock: TurnClock,
                 lag_s: list[float], rss_base: int, rss_end: int, live_traj_bytes: int,
                 spooled: list[tuple[int, int, float]], stop_s: float, errors: list[str],
                 raw_bytes_per_token: int) -> dict[str, Any]:
    """Everything one scale measured, in the units the table and the README use."""
    per_turn = {name: (cpu1[name] - cpu0[name]) * 1e3 / max(turns, 1) for name in cpu1}
    live = max(live_at_end, 1)
    # Without live episodes at the window's end (a run that finished) there is nothing to divide by.
    payload = sum(b for b, _, _ in spooled)
    tokens = sum(t for _, t, _ in spooled)
    append_s = sum(s for _, _, s in spooled)
    bytes_per_token = payload / tokens if tokens else float("nan")
    lag = _ms(percentiles(lag_s))
    rss_per_ep_kb = (rss_end - rss_base - live_traj_bytes) / live / 1024 if live_at_end else float("nan")
    cpu_coord = per_turn["coordinator"]
    ratio = bytes_per_token / raw_bytes_per_token
    return {
        "episodes": episodes, "live_at_window_start": live_at_start, "live_at_window_end": live_at_end,
        "ramp_s": round(ramp_s, 2), "window_s": round(window_s, 2), "turns": turns,
        "turns_per_s": round(turns / window_s, 2) if window_s > 0 else float("nan"),
        "cpu_ms_per_turn": {k: round(v, 3) for k, v in per_turn.items()},
        "cpu_cores_used": {k: round((cpu1[k] - cpu0[k]) / window_s, 3) for k in cpu1} if window_s > 0 else {},
        "turn_overhead_ms": _ms(percentiles(clock.overhead_s)),
        "model_ms": _ms(percentiles(clock.model_s)),
        "command_ms": _ms(percentiles(clock.command_s)),
        "loop_lag_ms": lag, "loop_lag_samples": len(lag_s),
        "rss_mb": {"before_episodes": round(rss_base / 2**20, 1), "window_end": round(rss_end / 2**20, 1),
                   "live_trajectory_arrays": round(live_traj_bytes / 2**20, 1)},
        "rss_per_live_episode_kb": round(rss_per_ep_kb, 1),
        # Nothing subtracted: what the coordinator holds per live episode at the window's end (issue 41's figure).
        "rss_per_live_episode_kb_whole": round((rss_end - rss_base) / live / 1024, 1) if live_at_end else float("nan"),
        "trajectories_spooled": len(spooled), "trajectory_tokens": tokens,
        "trajectory_bytes_per_token": round(bytes_per_token, 2), "raw_bytes_per_token": raw_bytes_per_token,
        "trajectory_bytes_ratio": round(ratio, 4),
        "spool_mb_per_s": round(payload / append_s / 2**20, 1) if append_s else float("nan"),
        "spool_trajectories_per_s": round(len(spooled) / append_s, 1) if append_s else float("nan"),
        "spool_mb": round(payload / 2**20, 1), "stop_s": round(stop_s, 2),
        "errors": errors[:20], "num_errors": len(errors),
        "targets": {
            "loop_lag_p99_under_100ms": lag["p99"] < TARGET_LAG_P99_MS,
            "coordinator_cpu_per_turn_under_1ms": cpu_coord < TARGET_CPU_PER_TURN_MS,
            "rss_per_live_episode_under_200kb": None if live_at_end == 0 else rss_per_ep_kb < TARGET_RSS_PER_EPISODE_KB,
            "trajectory_bytes_within_10pct_of_raw": ratio <= TARGET_BYTES_RATIO,
            "whole_rss_per_live_episode_at_most_256kb":
                None if live_at_end == 0 else (rss_end - rss_base) / live / 1024 <= TARGET_WHOLE_RSS_PER_EPISODE_KB,
        },
    }


def print_table(scales: list[dict[str, Any]], title: str) -> None:
    table = Table(title=title)
    table.add_column("metric", style="bold")
    for s in scales:
        table.add_column(f"{s['episodes']} eps", justify="right")
    rows: list[tuple[str, Any]] = [
        ("live episodes (window end)", lambda s: s["live_at_window_end"]),
        ("ramp-up s", lambda s: s["ramp_s"]),
        ("window s / turns", lambda s: f"{s['window_s']} / {s['turns']}"),
        ("turns/s", lambda s: s["turns_per_s"]),
        ("coordinator CPU ms/turn", lambda s: s["cpu_ms_per_turn"]["coordinator"]),
        ("sim inference CPU ms/turn", lambda s: s["cpu_ms_per_turn"]["sim_inference"]),
        ("sandbox host+shells CPU ms/turn", lambda s: s["cpu_ms_per_turn"]["sandbox_host"]),
        ("turn overhead p50 / p99 ms", lambda s: f"{s['turn_overhead_ms']['p50']} / {s['turn_overhead_ms']['p99']}"),
        ("model p50 ms", lambda s: s["model_ms"]["p50"]),
        ("command p50 / p99 ms", lambda s: f"{s['command_ms']['p50']} / {s['command_ms']['p99']}"),
        ("loop lag p50 / p99 / max ms", lambda s: f"{s['loop_lag_ms']['p50']} / {s['loop_lag_ms']['p99']} / "
                                                  f"{s['loop_lag_ms']['max']}"),
        ("wake-ups > 50 ms: count; loop thread on CPU / run queue / blocked",
         lambda s: (f"{w['count']}; {w['on_cpu_share']:.0%} / {w['run_queue_share']:.0%} / {w['blocked_share']:.0%}"
                    if (w := s.get("late_wakeups")) and w["count"] else "0")),
        ("RSS per episode KB at ramp end (no turns yet)", lambda s: s.get("rss_per_episode_at_ramp_end_kb")),
        ("RSS per live episode KB (window end, less arrays)", lambda s: s["rss_per_live_episode_kb"]),
        ("RSS per live episode KB (window end, whole)", lambda s: s.get("rss_per_live_episode_kb_whole")),
        ("journal B / frames / fsyncs per turn",
         lambda s: (f"{s['journal']['bytes_per_turn']:.0f} / {s['journal']['frames_per_turn']} / "
                    f"{s['journal']['fsyncs_per_turn']}" if s.get("journal") else "off")),
        ("trajectory B/token (raw)", lambda s: f"{s['trajectory_bytes_per_token']} ({s['raw_bytes_per_token']})"),
        ("trajectory / raw", lambda s: s["trajectory_bytes_ratio"]),
        ("spool MB/s, traj/s", lambda s: f"{s['spool_mb_per_s']}, {s['spool_trajectories_per_s']}"),
        ("GenerateBatched requests / results per message",
         lambda s: (f"{s['generate_packing']['requests_per_message']} / {s['generate_packing']['results_per_message']}"
                    f" (most {s['generate_packing'].get('most_results_in_a_message', '?')})"
                    if s.get("generate_packing") else "n/a (calls)")),
        ("prompt deltas: share of requests, resent whole",
         lambda s: (f"{s['prompt_deltas']['share_of_requests']:.0%}, {s['prompt_deltas']['resent_whole']:g}"
                    if s.get("prompt_deltas") else "n/a")),
        ("full GC: count / longest ms", lambda s: (f"{s['gc_pauses']['gen2']['count']} / "
                                                   f"{s['gc_pauses']['gen2']['max_ms']}"
                                                  if "gc_pauses" in s else "n/a")),
        ("errors", lambda s: s["num_errors"]),
    ]
    for name, get in rows:
        table.add_row(name, *[str(get(s)) for s in scales])
    for target in scales[0]["targets"]:
        table.add_row(f"target {target}", *[{True: "met", False: "MISSED", None: "n/a"}[s["targets"][target]]
                                              for s in scales])
    Console().print(table)
