"""bench/load/run.py at a tiny scale: real Episode, InferencePool, SSH sandboxes, codec and spool end to end."""

from __future__ import annotations

import json
from pathlib import Path

from bench.load import run as load


def test_quick_load_run_measures_every_figure(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    args = load.parse_args(["--quick", "--model", str(tiny_model_dir), "--out", str(out),
                            "--no-transcripts"])
    assert load.main_from_args(args) == 0
    report = json.loads(out.read_text())
    assert report["machine"]["cores"] >= 1 and report["settings"]["quick"] is True
    (scale,) = report["scales"]
    assert scale["num_errors"] == 0, scale["errors"]
    # 10 episodes x 5 turns, every one stopped by its turn limit and verified.
    assert scale["turns"] == 50 and scale["episode_statuses"] == {"ok": 10}
    assert scale["trajectories_spooled"] == 10
    # Each turn prefills what the server had not cached and samples 50..400 tokens.
    assert 10 * 5 * 50 < scale["trajectory_tokens"] < 10 * (5 * 420 + 2000)
    raw = 4 + 4 + 48 * 8
    assert scale["raw_bytes_per_token"] == raw
    assert 1.0 <= scale["trajectory_bytes_ratio"] < 1.10
    for key in ("coordinator", "sim_inference", "sandbox_host"):
        assert scale["cpu_ms_per_turn"][key] > 0
    assert all(v is not None and v >= 0 for v in scale["turn_overhead_ms"].values())
    assert scale["loop_lag_samples"] > 10
    assert scale["spool_mb_per_s"] > 0


def test_ablation_runs_each_variant_in_its_own_load_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    from bench.load import ablate

    out = tmp_path / "ablate.json"
    assert ablate.main(["--rounds", "1", "--variants", "full,floor", "--quick", "--model", str(tiny_model_dir),
                        "--no-transcripts", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["settings"]["variants"]["floor"] == ablate.VARIANTS["floor"]
    assert [r["variant"] for r in report["rows"]] == ["full", "floor"]
    full, floor = report["runs"]["full"][0], report["runs"]["floor"][0]
    assert full["num_errors"] == 0 and floor["num_errors"] == 0
    # The floor wrote no journal; the full run wrote 48 x 8 routing (384 B a token) and more with each turn.
    assert floor["journal_bytes_per_turn"] in (None, 0) and full["journal_bytes_per_turn"] > 50 * 384
