"""The end-of-run report as printed: one table of base / warm start / RL with Wilson intervals and family rows,
the SFT curve, the lift verdicts and the last line; older (before/after) and eval-less reports render too."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from typing import Any

from rich.console import Console

from t1.coordinator.run.console_report import eval_labels, lift_lines, print_report
from t1.coordinator.run.run_report import EvalsByLabel, RolloutTotals, RunReport, TrainerAtEnd
from t1.coordinator.run.sft_steer import CurvePoint
from t1.evals.results import JobSummaryValues
from t1.evals.stats import EvalSummary, RateSummary, wilson_interval


def _rate(resolved: int, attempts: int, mean_reward: float, infra: int = 0) -> RateSummary:
    return RateSummary(resolved / attempts, wilson_interval(resolved, attempts), attempts, resolved, mean_reward,
                       infra)


def _summary(resolved: int, attempts: int, families: dict[str, tuple[int, int]] | None = None,
             infra: int = 0) -> EvalSummary:
    rate = resolved / attempts
    job = JobSummaryValues(resolve_rate=rate, mean_reward=rate + 0.05, pass_at_k={1: rate}, infra_errors=infra,
                           num_tasks=20)
    fam = {name: _rate(k, n, k / n) for name, (k, n) in (families or {}).items()}
    return EvalSummary("job-1", "succeeded", job, _rate(resolved, attempts, rate + 0.05, infra), fam)


ROLLOUTS = RolloutTotals(episodes=0, turns=0, infra_errors=0, resumed=0, resume_turns_lost=0, resume_failed=0,
                         journal_recovered={}, spool_pending=0, policy_versions=(), training={})


def _report(evals: EvalsByLabel, **fields: Any) -> RunReport:
    base: dict[str, Any] = {"name": "x", "trainer": TrainerAtEnd(1, "done", 1), "fidelity": {}, "rollouts": ROLLOUTS}
    return RunReport(evals=evals, **{**base, **fields})


def _render(report: RunReport) -> str:
    buf = io.StringIO()
    print_report(report, Console(file=buf, width=160, force_terminal=False))
    return buf.getvalue()


def _three_row_report() -> RunReport:
    return _report({"base": {"heldout": _summary(10, 200, {"carry": (4, 100), "lookup": (6, 100)}, infra=3)},
                    "warm_start": {"heldout": _summary(60, 200, {"carry": (25, 100), "lookup": (35, 100)})},
                    "rl": {"heldout": _summary(110, 200, {"carry": (50, 100), "lookup": (60, 100)})}},
                   name="local", sft_curve=(CurvePoint(10, 0.3, 50), CurvePoint(20, 0.2, 50)), sft_kept_step=10,
                   trainer=TrainerAtEnd(12, "done", 9), fidelity={"t1_tito_drift_tokens": 0, "t1_kl": 0.01},
                   rollouts=replace(ROLLOUTS, episodes=900, infra_errors=3, turns=4000, policy_versions=(3, 4)),
                   report_path="/r/report.json", curves_png="/r/learning_curves.png")


def test_three_policies_in_one_table_with_intervals_attempts_and_family_rows() -> None:
    report = _three_row_report()
    assert eval_labels(report) == ["base", "warm_start", "rl"]
    out = _render(report)
    assert "\x1b[" not in out, "not a terminal: no escape codes"
    assert out.count("held-out solve rate on heldout") == 1, "one table for the three policies"
    lo, hi = wilson_interval(110, 200)
    rl_row = next(line for line in out.splitlines() if line.strip().startswith("│ RL") or " RL " in line)
    assert "0.550" in rl_row and f"[{lo:.3f}, {hi:.3f}]" in rl_row and "200" in rl_row
    base_row = next(line for line in out.splitlines() if "base" in line and "all" in line)
    assert "0.050" in base_row and base_row.rstrip(" │").endswith("3"), "infra errors shown apart"
    assert out.index("base") < out.index("warm start") < out.index("RL")
    assert out.count("carry") == 3 and out.count("lookup") == 3, "a row per family for each policy"
    assert "Wilson score interval" in out and "infra errors are excluded" in out
    assert "SFT: validation solve rate" in out and "0.300" in out
    sft_rows = {line.split()[1]: line for line in out.splitlines() if line.split()[1:2] in (["10"], ["20"])}
    assert "kept" in sft_rows["10"] and "kept" not in sft_rows["20"], "the warm start's round is marked"
    assert "heldout: RL vs warm start: +0.250; intervals do not overlap" in out
    assert "heldout: warm start vs base: +0.250; intervals do not overlap" in out
    assert out.rstrip().splitlines()[-1] == ("t1: run local done · report /r/report.json · "
                                              "learning curves /r/learning_curves.png")


def test_lift_verdict_says_overlap_when_the_intervals_overlap() -> None:
    report = _report({"warm_start": {"h": _summary(50, 100)}, "rl": {"h": _summary(55, 100)}})
    assert lift_lines(report) == ["h: RL vs warm start: +0.050; intervals overlap"]


def test_before_after_report_renders() -> None:
    # the eval-only configs' labels
    report = _report({"before": {"heldout": _summary(0, 4)}, "after": {"heldout": _summary(2, 4, infra=1)}},
                     name="old")
    out = _render(report)
    assert "before training" in out and "after training" in out and "0.500" in out
    assert "heldout: after training vs before training: +0.500" in out
    assert out.rstrip().splitlines()[-1] == "t1: run old done"


def test_report_without_evals_still_prints_the_trainer_table() -> None:
    out = _render(_report({}, fidelity={"t1_kl": 0.5}, rollouts=replace(ROLLOUTS, episodes=2)))
    assert "Fidelity and training" in out and "solve rate on" not in out


def test_resumed_episodes_are_counted_only_after_a_restart_that_found_some() -> None:
    plain = _render(_report({}, rollouts=replace(ROLLOUTS, episodes=2)))
    resumed = _render(_report({}, rollouts=replace(ROLLOUTS, episodes=9, resumed=4, resume_turns_lost=3,
                                                   resume_failed=1)))
    assert "resumed after a coordinator restart" not in plain
    assert "resumed after a coordinator restart" in resumed and "4 (3, 1)" in resumed


def test_report_json_keeps_its_keys() -> None:
    """report.json is read by bench/learning.py, t1 view and people: the typed report writes the same JSON."""
    report = replace(_three_row_report(), finished=False, planned_steps=40,
                     rollouts=replace(_three_row_report().rollouts, gateway_segments={"tools": 2, "first": 1},
                                      segments=950, segments_with_drift=0))
    data = json.loads(json.dumps(report.to_json()))
    assert list(data) == ["name", "base", "warm_start", "rl", "finished", "planned_steps", "sft_curve",
                          "sft_kept_step", "trainer", "fidelity", "rollouts", "curves_png", "report_path"]
    assert data["rl"]["heldout"] == {
        "job_id": "job-1", "resolve_rate": 0.55, "mean_reward": 0.6000000000000001, "pass_at_k": {"1": 0.55},
        "infra_errors": 0, "num_tasks": 20, "ci95": list(wilson_interval(110, 200)), "ci_method": "wilson",
        "attempts": 200, "resolved": 110, "state": "succeeded",
        "by_family": {"carry": {"resolve_rate": 0.5, "ci95": list(wilson_interval(50, 100)), "attempts": 100,
                                "resolved": 50, "mean_reward": 0.5, "infra_errors": 0},
                      "lookup": {"resolve_rate": 0.6, "ci95": list(wilson_interval(60, 100)), "attempts": 100,
                                 "resolved": 60, "mean_reward": 0.6, "infra_errors": 0}}}
    assert data["sft_curve"] == [{"step": 10, "solve_rate": 0.3, "attempts": 50},
                                 {"step": 20, "solve_rate": 0.2, "attempts": 50}]
    assert data["trainer"] == {"step": 12, "stage": "done", "policy_version": 9}
    assert data["rollouts"] == {"episodes": 900, "turns": 4000, "infra_errors": 3, "segments": 950,
                                "segments_with_drift": 0, "resumed": 0,
                                "resume_turns_lost": 0, "resume_failed": 0, "journal_recovered": {},
                                "spool_pending": 0, "policy_versions": [3, 4], "training": {},
                                "gateway_segments": {"first": 1, "tools": 2}}
    assert (data["finished"], data["planned_steps"], data["sft_kept_step"]) == (False, 40, 10)
    bare = _report({}).to_json()
    assert "sft_kept_step" not in bare and "curves_png" not in bare and "gateway_segments" not in bare["rollouts"]
    assert bare["sft_curve"] == [] and bare["report_path"] == ""


def test_turns_and_segments_per_episode_print_under_the_lifts() -> None:
    shape = {"turns": {"median": 22.0, "p90": 31.0, "min": 13.0, "max": 40.0},
             "segments": {"median": 4.0, "p90": 7.0, "min": 3.0, "max": 9.0}}
    report = _report({"rl": {"heldout": replace(_summary(10, 20), shape=shape)}, "base": {"heldout": _summary(0, 20)}},
                     rollouts=replace(ROLLOUTS, segments=80, segments_with_drift=0))
    out = _render(report)
    assert "heldout: RL: turns per episode median 22 (p90 31, min 13); segments per episode median 4 (p90 7, min 3)" \
        in out
    assert "heldout: base: turns" not in out  # no shape recorded: no line
    assert "TITO segments (with drift)" in out and "80 (0)" in out
    assert report.to_json()["rl"]["heldout"]["segments"] == shape["segments"]
