"""bench/fidelity/: its pure helpers, and end to end on tiny runs (slow): keys, drift 0, exact schedule replay."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.fidelity import measure as fidelity  # noqa: E402
from bench.fidelity.cli import main  # noqa: E402
from bench.fidelity.sweep import parse_shape  # noqa: E402


def test_flipped_rows_compares_expert_sets_and_skips_missing_records():
    record = np.array([[[1, 2], [3, 4]], [[5, 6], [7, 0]], [[255, 255], [1, 2]]], np.uint8)
    live = np.array([[[2, 1], [3, 5]], [[5, 6], [7, 0]], [[0, 1], [2, 1]]], np.uint8)
    flipped, recorded = fidelity.flipped_rows(live, record)
    assert flipped.tolist() == [[False, True], [False, False], [False, False]]
    assert recorded.tolist() == [[True, True], [True, True], [False, True]]


def test_reduction_ci_brackets_the_point_estimate():
    rng = np.random.default_rng(1)
    d_no = rng.exponential(1.0, 500)
    d_r3 = d_no * 0.5
    lo, hi = fidelity.reduction_ci(d_no, d_r3)
    assert lo == pytest.approx(0.5) and hi == pytest.approx(0.5)
    other = rng.exponential(1.0, 500)
    lo, hi = fidelity.reduction_ci(d_no, other)
    assert lo < 1 - other.mean() / d_no.mean() < hi and hi - lo > 0.05


def test_parse_shape_names_the_bad_entry():
    assert parse_shape("8x128x8") == (8, 128, 8)
    with pytest.raises(ValueError, match="8x128"):
        parse_shape("8x128")
    with pytest.raises(ValueError, match="top_k"):
        parse_shape("2x4x5")


@pytest.mark.slow
def test_fidelity_bench_writes_its_keys(tmp_path):
    out = tmp_path / "fid.json"
    assert main(["--out", str(out), "--episodes", "1", "--turns", "2", "--max-tokens", "8",
                          "--time-reps", "1", "--model-dir", str(tmp_path / "model"), "--trained", "none"]) == 0
    got = json.loads(out.read_text())
    for key in ("tokens", "mean_abs_dlogp_no_r3", "mean_abs_dlogp_r3", "max_abs_dlogp_no_r3", "max_abs_dlogp_r3",
                "router_disagreement_rate", "drift_tokens", "repaired_turns", "retokenize_mismatch_rate",
                "replay_overhead", "machine", "note"):
        assert key in got, key
    assert got["drift_tokens"] == 0 and got["tokens"] > 0 and got["turns"] == 2
    # The sampler's own schedule (KV cache, recorded routing) reproduces its logprobs: the trainer's
    # logprob math matches the sampler's, so the full-forward error is kernel shape dependence.
    assert got["max_abs_dlogp_schedule_r3"] <= 1e-6


@pytest.mark.slow
def test_fidelity_sweep_writes_a_row_per_setting(tmp_path):
    out = tmp_path / "sweep.json"
    assert main(["--sweep", "--out", str(out), "--sweep-shapes", "3x8x2,2x16x4", "--sweep-scales", "2,0.5",
                          "--episodes", "1", "--turns", "2", "--max-tokens", "8", "--time-reps", "1"]) == 0
    got = json.loads(out.read_text())
    rows = got["rows"]
    assert [(r["shape"], r["router_scale"]) for r in rows] == [("3x8x2", 2.0), ("3x8x2", 0.5), ("2x16x4", 2.0),
                                                               ("2x16x4", 0.5)]
    assert [r["default"] for r in rows] == [True, False, False, False]
    assert rows[2]["model"]["experts"] == 16 and rows[2]["model"]["layers"] == 2 and rows[3]["model"]["top_k"] == 4
    for r in rows:
        assert r["drift_tokens"] == 0 and r["tokens"] > 0
        assert 0 <= r["router_row_flip_rate"] <= 1 and 0 <= r["flipped_loss_token_share"] <= 1
        assert r["r3_reduction_ci95"][0] <= r["r3_reduction"] <= r["r3_reduction_ci95"][1]
    assert got["default_setting"]["shape"] == "3x8x2" and "production_reference" in got and got["machine"]
