"""bench/learning.py's pure parts: the 95% interval, one policy's row, the lift verdict, each run's config."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.learning import policy_row, run_config, verdict, wilson  # noqa: E402
from t1.config.loader import validate  # noqa: E402


def test_wilson_interval() -> None:
    lo, hi = wilson(100, 200)
    assert 0.43 < lo < 0.44 and 0.56 < hi < 0.57
    assert wilson(0, 200)[0] == 0.0 and wilson(200, 200)[1] == 1.0


def _row(rate: float, n: int = 200) -> dict:
    return policy_row({"resolve_rate": rate, "num_tasks": n // 4, "infra_errors": 0, "mean_reward": 0.0}, 4)


def test_verdict_needs_lift_apart_intervals_and_warm_above_base() -> None:
    assert verdict({"base": _row(0.0), "warm_start": _row(0.3), "rl": _row(0.5)})["meets"]
    small = verdict({"base": _row(0.0), "warm_start": _row(0.3), "rl": _row(0.38)})
    assert not small["meets"] and "lift" in small["why"] and "overlap" in small["why"]
    flat = verdict({"base": _row(0.3), "warm_start": _row(0.3), "rl": _row(0.6)})
    assert not flat["meets"] and "base" in flat["why"]
    assert not verdict({"base": _row(0.0)})["meets"]


def test_each_run_gets_its_own_valid_config(tmp_path: Path) -> None:
    base = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    cfg = run_config(base, tmp_path / "binary-s1", 1, "binary")
    validate(cfg)
    assert cfg["reward"]["mode"] == "binary" and cfg["seed"] == cfg["trainer"]["seed"] == 1
    paths = [cfg["coordinator"]["run_dir"], cfg["trainer"]["work_dir"], cfg["inference"]["model"]["path"],
             *(s["path"] for s in cfg["tasks"]["sets"].values())]
    assert all(str(p).startswith(str(tmp_path / "binary-s1")) for p in paths)
    assert "runs_dir" not in cfg["coordinator"]  # else the run would go to a numbered dir outside root
    assert base["reward"]["mode"] == "count"  # the example itself is untouched
