"""The quick load bench against its committed baseline (bench/results/load_cpu_quick.json), with a tolerance.

The run's shape must match the baseline exactly (turns, statuses, spooled trajectories, bytes per token);
costs (coordinator CPU per turn, the loop's longest lag) move with the machine's load, so they fail only
past TOLERANCE times the baseline. Regenerate
the baseline with `python -m bench.load --quick --out bench/results/load_cpu_quick.json`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "bench" / "results" / "load_cpu_quick.json"
# The quick run measures 50 turns on a shared 2-core machine: its coordinator CPU per turn moved from 3 to
# 27 ms between two runs of one commit. What this catches is a regression of an order of magnitude.
TOLERANCE = 5.0


@pytest.mark.slow
def test_quick_load_bench_stays_within_its_committed_baseline(tiny_model_dir: Path, tmp_path: Path) -> None:
    baseline = json.loads(BASELINE.read_text())
    assert baseline["settings"]["quick"] is True, "the committed baseline must be a --quick run"
    out = tmp_path / "load.json"
    # Its own process, as the baseline was made: inside pytest, log capture alone costs the coordinator
    # several times its CPU per turn.
    run = subprocess.run([sys.executable, "-m", "bench.load", "--quick", "--model", str(tiny_model_dir), "--out",
                          str(out)], cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (base,) = baseline["scales"]
    (now,) = json.loads(out.read_text())["scales"]
    for key in ("episodes", "turns", "episode_statuses", "trajectories_spooled", "raw_bytes_per_token", "num_errors"):
        assert now[key] == base[key], (key, now[key], base[key])
    assert now["trajectory_bytes_ratio"] <= base["trajectory_bytes_ratio"] * 1.05
    coordinator_ms, base_ms = now["cpu_ms_per_turn"]["coordinator"], base["cpu_ms_per_turn"]["coordinator"]
    assert coordinator_ms <= base_ms * TOLERANCE, f"coordinator CPU {coordinator_ms} ms/turn, baseline {base_ms}"
    assert now["loop_lag_ms"]["max"] <= max(base["loop_lag_ms"]["max"], 100.0) * TOLERANCE
