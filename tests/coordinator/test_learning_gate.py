"""The learning gate (bench/learning_gate.py, bench/learning_gate.yaml): after a short run of the real loop
(sandboxes, TITO, process rewards, SFT, critic warm-up, PPO with routing replay, two evals) the policy must take the
way only the reward shows pays in most held-out attempts (the demonstrations it imitates take it in under half) and
solve about as many as the warm start or more, each by its calibrated bar, with TITO drift 0, replay coverage 1.0 and
no infra errors.

The bars held at 10 of 10 calibration seeds, and the gate failed each break of bench/learning_gate.py's BREAKS (PPO's
loss sign flipped, the reward zeroed, routing replayed from the wrong layer): docs/learning.md, The learning gate.
The breaks themselves are checked here without a run: each applies to today's code, once.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.learning_gate import BREAKS, broken_tree, first_command_share, gate_run, gate_verdict  # noqa: E402


@pytest.mark.timeout(1500)
def test_a_short_run_lifts_the_held_out_solve_rate_by_the_calibrated_bar() -> None:
    # Not tmp_path: the sandboxes' own uids must traverse to their trees, and an xdist worker's base folder is 0700.
    root = Path(tempfile.mkdtemp(prefix="t1-learning-gate-"))
    root.chmod(0o711)
    try:
        run = gate_run(root / "gate", seed=0, timeout_s=1200)
        log = (root / "gate" / "coordinator.log").read_text(errors="replace")[-3000:]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert run["rows"], log
    assert run["rows"]["rl"]["attempts"] >= 120 and run["rows"]["warm_start"]["attempts"] >= 120, run["rows"]
    assert all(run["choice"][x]["attempts"] >= 120 for x in ("warm_start", "rl")), run["choice"]
    assert run["passes"], f"{run['why']}: {run['rows']} {run['choice']}"


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_break_applies_to_the_code_once_and_only_to_its_copy(tmp_path: Path, name: str) -> None:
    rel, old, new = BREAKS[name]
    tree = broken_tree(tmp_path, name)
    broken = (tree / "t1" / rel).read_text()
    assert new in broken and old not in broken
    assert (ROOT / "t1" / rel).read_text().count(old) == 1  # the checkout keeps its code
    assert (tree / "t1" / "__init__.py").is_file()


def test_a_break_that_no_longer_matches_the_code_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BREAKS, "stale", ("trainer/losses.py", "text no file has", "x"))
    with pytest.raises(ValueError, match=r"break stale: t1/trainer/losses\.py holds 0 copies"):
        broken_tree(tmp_path, "stale")
    with pytest.raises(ValueError, match="no break 'nope'"):
        broken_tree(tmp_path, "nope")


def test_the_verdict_and_the_first_command_share_by_hand(tmp_path: Path) -> None:
    job = tmp_path / "job"
    for i, first in enumerate(["bash fetch.sh --wait", "bash fetch.sh", "bash fetch.sh --waiting", None]):
        (job / f"t{i}").mkdir(parents=True)
        body = f"## Turn 0\n\n### $ {first}\n\nexit 0\n\n### $ bash fetch.sh --wait\n" if first else "## Turn 0\n"
        (job / f"t{i}" / "a0.md").write_text(f"# Episode e{i}\n\n{body}")
    assert first_command_share(job, "--wait") == {"took": 1, "attempts": 4, "share": 0.25}
    assert first_command_share(tmp_path / "none", "--wait")["share"] is None

    def run(warm: tuple[float, float], rl: tuple[float, float], **extra: object) -> dict:
        rows = {"warm_start": {"solve_rate": warm[0]}, "rl": {"solve_rate": rl[0]}}
        choice = {"warm_start": {"share": warm[1]}, "rl": {"share": rl[1]}}
        return {"rc": 0, "rows": rows, "choice": choice, "tito_drift_tokens": 0, "infra_errors": 0, **extra}

    report = {"fidelity": {"t1_routing_replay_coverage": 1.0}}
    good = gate_verdict(run((0.50, 0.50), (0.70, 0.90)), report)
    assert good["passes"] and good["why"] == "" and round(good["choice_gain"], 3) == 0.4
    assert "rl's --wait share of first commands 0.600 < 0.65" in gate_verdict(run((0.5, 0.5), (0.7, 0.6)),
                                                                           report)["why"]
    assert gate_verdict(run((0.5, 0.5), (0.46, 0.9)), report)["passes"]  # within the noise of 128 attempts
    assert "solve rate -0.100 from the warm start's, below -0.05" in gate_verdict(run((0.5, 0.5), (0.4, 0.9)),
                                                                                  report)["why"]
    assert "TITO drift 3" in gate_verdict(run((0.5, 0.5), (0.7, 0.9), tito_drift_tokens=3), report)["why"]
    assert "coverage 0.9" in gate_verdict(run((0.5, 0.5), (0.7, 0.9)), {"fidelity": {
        "t1_routing_replay_coverage": 0.9}})["why"]
    failed = gate_verdict({**run((0.5, 0.5), (0.7, 0.9)), "rc": 1, "rows": {}}, report)
    assert not failed["passes"] and "run failed (rc 1" in failed["why"]
