"""The end-of-run report on the console: one table of the evaluated policies (base, warm start, RL) per task
set with the solve rate, its 95% Wilson interval, attempts, mean reward and infra errors, overall and per
task family; the SFT curve; the fidelity metrics; and a last line naming the report and curve files.

Pure over the report dict stages.write_report writes: every key whose value maps set names to eval
summaries is an evaluated policy (known labels first, in run order; any others after), so eval-only
or before/after reports render too. Infra errors are excluded from every rate and shown apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from typing import Any

from rich.console import Console
from rich.table import Table

from t1.evals.stats import intervals_overlap, wilson_interval

LABEL_ORDER = ("base", "before", "warm_start", "rl", "after")
LABEL_TITLES = {"base": "base", "before": "before training", "warm_start": "warm start", "rl": "RL",
                "after": "after training"}
CI_NOTE = "95% CI: Wilson score interval over scored attempts; infra errors are excluded from rates and means"


def _is_eval(value: Any) -> bool:
    return (isinstance(value, Mapping) and bool(value)
            and all(isinstance(v, Mapping) and "resolve_rate" in v for v in value.values()))


def eval_labels(report: Mapping[str, Any]) -> list[str]:
    """The report's evaluated policies: known labels in run order, then any others by name."""
    found = [k for k, v in report.items() if _is_eval(v)]
    known = [k for k in LABEL_ORDER if k in found]
    return known + sorted(k for k in found if k not in LABEL_ORDER)


def ci_of(summary: Mapping[str, Any]) -> tuple[float, float] | None:
    """The summary's interval; computed from rate and attempts for summaries that predate it; None if unknown."""
    if "ci95" in summary:
        lo, hi = summary["ci95"]
        return float(lo), float(hi)
    if "attempts" in summary and "resolved" in summary:
        return wilson_interval(int(summary["resolved"]), int(summary["attempts"]))
    return None


def _row(summary: Mapping[str, Any]) -> list[str]:
    ci = ci_of(summary)
    attempts = summary.get("attempts")
    return [f"{summary['resolve_rate']:.3f}", f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-",
            str(attempts) if attempts is not None else "-", f"{summary.get('mean_reward', 0.0):.3f}",
            str(summary.get("infra_errors", 0))]


def lift_lines(report: Mapping[str, Any]) -> list[str]:
    """One line per set and consecutive pair of policies: the change in solve rate, and whether the 95%
    intervals overlap (non-overlapping intervals are the report's claim of a real difference)."""
    labels = eval_labels(report)
    lines = []
    for name in sorted({s for lb in labels for s in report[lb]}):
        have = [lb for lb in labels if name in report[lb]]
        for a, b in pairwise(have):
            sa, sb = report[a][name], report[b][name]
            ca, cb = ci_of(sa), ci_of(sb)
            verdict = "" if ca is None or cb is None else (
                "; intervals overlap" if intervals_overlap(ca, cb) else "; intervals do not overlap")
            lines.append(f"{name}: {LABEL_TITLES.get(b, b)} vs {LABEL_TITLES.get(a, a)}: "
                         f"{sb['resolve_rate'] - sa['resolve_rate']:+.3f}{verdict}")
    return lines


def eval_table(report: Mapping[str, Any], set_name: str) -> Table:
    """The policies of one task set: an overall row each, then a row per task family."""
    table = Table(title=f"Run {report.get('name', '')}: held-out solve rate on {set_name}", title_justify="left",
                  caption=CI_NOTE, caption_justify="left")
    for col in ("policy", "family", "solve rate", "95% CI", "attempts", "mean reward", "infra errors"):
        table.add_column(col, justify="left" if col in ("policy", "family") else "right")
    labels = [lb for lb in eval_labels(report) if set_name in report[lb]]
    for i, label in enumerate(labels):
        summary = report[label][set_name]
        if i:
            table.add_section()
        table.add_row(LABEL_TITLES.get(label, label), "all", *_row(summary))
        for family, fam in sorted(summary.get("by_family", {}).items()):
            table.add_row("", family, *_row(fam))
    return table


def sft_table(curve: list[Mapping[str, Any]], kept_step: int | None = None) -> Table:
    """Solve rate on the validation split after each SFT round (SFT ran until it stopped rising); the round
    whose weights are the warm start is marked."""
    table = Table(title="SFT: validation solve rate", title_justify="left")
    for col in ("SFT step", "solve rate", "95% CI", "attempts", "warm start"):
        table.add_column(col, justify="right")
    for point in curve:
        n = int(point.get("attempts", 0))
        k = round(float(point["solve_rate"]) * n)
        lo, hi = wilson_interval(min(max(k, 0), n), n)
        table.add_row(str(point["step"]), f"{point['solve_rate']:.3f}", f"[{lo:.3f}, {hi:.3f}]" if n else "-", str(n),
                      "kept" if point["step"] == kept_step else "")
    return table


def fidelity_table(report: Mapping[str, Any]) -> Table:
    fid = Table(title="Fidelity and training (last trainer step)", title_justify="left")
    fid.add_column("metric")
    fid.add_column("value", justify="right")
    for key, value in sorted(report.get("fidelity", {}).items()):
        fid.add_row(key, f"{value:.6g}")
    tr, ro = report.get("trainer", {}), report.get("rollouts", {})
    fid.add_row("trainer step / stage", f"{tr.get('step', 0)} / {tr.get('stage', '?')}")
    fid.add_row("policy version", str(tr.get("policy_version", 0)))
    fid.add_row("episodes, all stages (infra errors)", f"{ro.get('episodes', 0)} ({ro.get('infra_errors', 0)})")
    fid.add_row("turns", str(ro.get("turns", 0)))
    if ro.get("resumed") or ro.get("resume_failed"):  # a restart found live episodes in the journal
        fid.add_row("episodes resumed after a coordinator restart (turns lost, could not resume)",
                    f"{ro['resumed']} ({ro.get('resume_turns_lost', 0)}, {ro.get('resume_failed', 0)})")
    fid.add_row("policy versions in training rollouts", ", ".join(map(str, ro.get("policy_versions", []))) or "-")
    return fid


def report_tables(report: Mapping[str, Any]) -> list[Table]:
    """Rich tables for a report dict (pure)."""
    labels = eval_labels(report)
    tables = [eval_table(report, name) for name in sorted({s for lb in labels for s in report[lb]})]
    if report.get("sft_curve"):
        tables.append(sft_table(report["sft_curve"], report.get("sft_kept_step")))
    tables.append(fidelity_table(report))
    return tables


def last_line(report: Mapping[str, Any]) -> str:
    """The run's last printed line: where its report and its learning curves are."""
    if report.get("finished", True):
        parts = [f"t1: run {report.get('name', '')} done"]
    else:
        step = report.get("trainer", {}).get("step", 0)
        parts = [f"t1: run {report.get('name', '')} stopped before its end, at trainer step {step} of "
                 f"{report.get('planned_steps', '?')}"]
    if report.get("report_path"):
        parts.append(f"report {report['report_path']}")
    if report.get("curves_png"):
        parts.append(f"learning curves {report['curves_png']}")
    return " · ".join(parts)


PIPE_WIDTH = 120  # not a terminal (CI, a pipe, a file): wide enough that no table row wraps


def print_report(report: Mapping[str, Any], console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=PIPE_WIDTH)
    for table in report_tables(report):
        console.print(table)
    for line in lift_lines(report):
        console.print(line, markup=False, highlight=False)
    console.print(last_line(report), markup=False, highlight=False, soft_wrap=True)
