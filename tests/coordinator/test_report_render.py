"""The end-of-run report as printed: one table of base / warm start / RL with Wilson intervals and family rows,
the SFT curve, the lift verdicts and the last line; older (before/after) and eval-less reports render too."""

from __future__ import annotations

import io

from rich.console import Console

from t1.coordinator.report import eval_labels, lift_lines, print_report
from t1.evals.stats import wilson_interval


def _summary(resolved: int, attempts: int, families: dict[str, tuple[int, int]] | None = None,
             infra: int = 0) -> dict:
    fam = {name: {"resolve_rate": k / n, "ci95": list(wilson_interval(k, n)), "attempts": n, "resolved": k,
                  "mean_reward": k / n, "infra_errors": 0} for name, (k, n) in (families or {}).items()}
    return {"resolve_rate": resolved / attempts, "ci95": list(wilson_interval(resolved, attempts)),
            "attempts": attempts, "resolved": resolved, "mean_reward": resolved / attempts + 0.05,
            "infra_errors": infra, "pass_at_k": {"1": resolved / attempts}, "num_tasks": 20, "by_family": fam}


def _render(report: dict) -> str:
    buf = io.StringIO()
    print_report(report, Console(file=buf, width=160, force_terminal=False))
    return buf.getvalue()


def _three_row_report() -> dict:
    return {"name": "local", "base": {"heldout": _summary(10, 200, {"carry": (4, 100), "lookup": (6, 100)}, infra=3)},
            "warm_start": {"heldout": _summary(60, 200, {"carry": (25, 100), "lookup": (35, 100)})},
            "rl": {"heldout": _summary(110, 200, {"carry": (50, 100), "lookup": (60, 100)})},
            "sft_curve": [{"step": 10, "solve_rate": 0.3, "attempts": 50}, {"step": 20, "solve_rate": 0.2,
                                                                            "attempts": 50}],
            "sft_kept_step": 10,
            "trainer": {"step": 12, "stage": "done", "policy_version": 9},
            "fidelity": {"t1_tito_drift_tokens": 0, "t1_kl": 0.01},
            "rollouts": {"episodes": 900, "infra_errors": 3, "turns": 4000, "policy_versions": [3, 4]},
            "report_path": "/r/report.json", "curves_png": "/r/learning_curves.png"}


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
    report = {"warm_start": {"h": _summary(50, 100)}, "rl": {"h": _summary(55, 100)}}
    assert lift_lines(report) == ["h: RL vs warm start: +0.050; intervals overlap"]


def test_before_after_report_without_intervals_renders() -> None:
    # a report written before intervals existed (and the eval-only configs' labels)
    report = {"name": "old", "before": {"heldout": {"resolve_rate": 0.0, "mean_reward": 0.0, "pass_at_k": {},
                                                    "infra_errors": 0, "num_tasks": 3}},
              "after": {"heldout": {"resolve_rate": 0.5, "mean_reward": 0.4, "pass_at_k": {"1": 0.5},
                                    "infra_errors": 1, "num_tasks": 3}},
              "trainer": {"step": 3, "stage": "done"}, "fidelity": {}, "rollouts": {}}
    out = _render(report)
    assert "before training" in out and "after training" in out and "0.500" in out
    assert "heldout: after training vs before training: +0.500" in out
    assert out.rstrip().splitlines()[-1] == "t1: run old done"


def test_report_without_evals_still_prints_the_trainer_table() -> None:
    out = _render({"name": "x", "trainer": {"step": 1, "stage": "done"}, "fidelity": {"t1_kl": 0.5},
                   "rollouts": {"episodes": 2}})
    assert "Fidelity and training" in out and "solve rate on" not in out


def test_resumed_episodes_are_counted_only_after_a_restart_that_found_some() -> None:
    plain = _render({"name": "x", "trainer": {"step": 1, "stage": "done"}, "rollouts": {"episodes": 2, "resumed": 0}})
    resumed = _render({"name": "x", "trainer": {"step": 1, "stage": "done"},
                       "rollouts": {"episodes": 9, "resumed": 4, "resume_turns_lost": 3, "resume_failed": 1}})
    assert "resumed after a coordinator restart" not in plain
    assert "resumed after a coordinator restart" in resumed and "4 (3, 1)" in resumed
