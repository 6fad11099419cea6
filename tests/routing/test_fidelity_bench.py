"""bench/fidelity.py end to end on a tiny run: the JSON has the promised keys and drift is 0."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_fidelity_bench_writes_its_keys(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench import fidelity

    out = tmp_path / "fid.json"
    assert fidelity.main(["--out", str(out), "--episodes", "1", "--turns", "2", "--max-tokens", "8",
                          "--time-reps", "1", "--model-dir", str(tmp_path / "model")]) == 0
    got = json.loads(out.read_text())
    for key in ("tokens", "mean_abs_dlogp_no_r3", "mean_abs_dlogp_r3", "max_abs_dlogp_no_r3", "max_abs_dlogp_r3",
                "router_disagreement_rate", "drift_tokens", "repaired_turns", "retokenize_mismatch_rate",
                "replay_overhead", "machine"):
        assert key in got, key
    assert got["drift_tokens"] == 0 and got["tokens"] > 0 and got["turns"] == 2
