"""The end-of-run report on the console: one table of the evaluated policies (base, warm start, RL) per task
set with the solve rate, its 95% Wilson interval, attempts, mean reward and infra errors, overall and per
task family; the SFT curve; the fidelity metrics; the lifts and the turns and segments per episode; and a last
line naming the report and curve files.

Pure over the RunReport stages.write_report returns: every label with summaries is an evaluated policy
(known labels first, in run order; any others after), so eval-only or before/after reports render too.
Infra errors are excluded from every rate and shown apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from rich.console import Console
from rich.table import Table

from t1.coordinator.run.run_report import RunReport
from t1.coordinator.run.sft_steer import CurvePoint
from t1.evals.stats import EvalSummary, RateSummary, intervals_overlap, wilson_interval

LABEL_ORDER = ("base", "before", "warm_start", "rl", "after")
LABEL_TITLES = {"base": "base", "before": "before training", "warm_start": "warm start", "rl": "RL",
                "after": "after training"}
CI_NOTE = "95% CI: Wilson score interval over scored attempts; infra errors are excluded from rates and means"


def eval_labels(report: RunReport) -> list[str]:
    """The report's evaluated policies: known labels in run order, then any others by name."""
    found = [label for label, sets in report.evals.items() if sets]
    known = [k for k in LABEL_ORDER if k in found]
    return known + sorted(k for k in found if k not in LABEL_ORDER)


def _cells(rate: float, ci: tuple[float, float], attempts: int, mean_reward: float, infra_errors: int) -> list[str]:
    return [f"{rate:.3f}", f"[{ci[0]:.3f}, {ci[1]:.3f}]", str(attempts), f"{mean_reward:.3f}", str(infra_errors)]


def _row(s: EvalSummary) -> list[str]:
    """A policy's overall row: the job's rate, mean reward and infra errors; the interval over scored attempts."""
    return _cells(s.job.resolve_rate, s.overall.ci95, s.overall.attempts, s.job.mean_reward, s.job.infra_errors)


def _family_row(r: RateSummary) -> list[str]:
    return _cells(r.solve_rate, r.ci95, r.attempts, r.mean_reward, r.infra_errors)


def _set_names(report: RunReport) -> list[str]:
    return sorted({name for label in eval_labels(report) for name in report.evals[label]})


def lift_lines(report: RunReport) -> list[str]:
    """One line per set and consecutive pair of policies: the change in solve rate, and whether the 95%
    intervals overlap (non-overlapping intervals are the report's claim of a real difference)."""
    labels = eval_labels(report)
    lines = []
    for name in _set_names(report):
        have = [lb for lb in labels if name in report.evals[lb]]
        for a, b in pairwise(have):
            sa, sb = report.evals[a][name], report.evals[b][name]
            verdict = "intervals overlap" if intervals_overlap(sa.overall.ci95, sb.overall.ci95) \
                else "intervals do not overlap"
            lines.append(f"{name}: {LABEL_TITLES.get(b, b)} vs {LABEL_TITLES.get(a, a)}: "
                         f"{sb.job.resolve_rate - sa.job.resolve_rate:+.3f}; {verdict}")
    return lines


def shape_lines(report: RunReport) -> list[str]:
    """One line per evaluated policy and set: turns and segments per episode (median, p90, min), where recorded."""
    lines = []
    for label in eval_labels(report):
        for name, summary in sorted(report.evals[label].items()):
            parts = [f"{what} per episode median {s['median']:g} (p90 {s['p90']:g}, min {s['min']:g})"
                     for what in ("turns", "segments") if (s := summary.shape.get(what))]
            if parts:
                lines.append(f"{name}: {LABEL_TITLES.get(label, label)}: " + "; ".join(parts))
    return lines


def eval_table(report: RunReport, set_name: str) -> Table:
    """The policies of one task set: an overall row each, then a row per task family."""
    table = Table(title=f"Run {report.name}: held-out solve rate on {set_name}", title_justify="left",
                  caption=CI_NOTE, caption_justify="left")
    for col in ("policy", "family", "solve rate", "95% CI", "attempts", "mean reward", "infra errors"):
        table.add_column(col, justify="left" if col in ("policy", "family") else "right")
    labels = [lb for lb in eval_labels(report) if set_name in report.evals[lb]]
    for i, label in enumerate(labels):
        summary = report.evals[label][set_name]
        if i:
            table.add_section()
        table.add_row(LABEL_TITLES.get(label, label), "all", *_row(summary))
        for family, fam in sorted(summary.by_family.items()):
            table.add_row("", family, *_family_row(fam))
    return table


def sft_table(curve: Sequence[CurvePoint], kept_step: int | None = None) -> Table:
    """Solve rate on the validation split after each SFT round (SFT ran until it stopped rising); the round
    whose weights are the warm start is marked."""
    table = Table(title="SFT: validation solve rate", title_justify="left")
    for col in ("SFT step", "solve rate", "95% CI", "attempts", "warm start"):
        table.add_column(col, justify="right")
    for point in curve:
        n = point.attempts
        k = round(point.solve_rate * n)
        lo, hi = wilson_interval(min(max(k, 0), n), n)
        table.add_row(str(point.step), f"{point.solve_rate:.3f}", f"[{lo:.3f}, {hi:.3f}]" if n else "-", str(n),
                      "kept" if point.step == kept_step else "")
    return table


def fidelity_table(report: RunReport) -> Table:
    fid = Table(title="Fidelity and training (last trainer step)", title_justify="left")
    fid.add_column("metric")
    fid.add_column("value", justify="right")
    for key, value in sorted(report.fidelity.items()):
        fid.add_row(key, f"{value:.6g}")
    tr, ro = report.trainer, report.rollouts
    fid.add_row("trainer step / stage", f"{tr.step} / {tr.stage}")
    fid.add_row("policy version", str(tr.policy_version))
    fid.add_row("episodes, all stages (infra errors)", f"{ro.episodes} ({ro.infra_errors})")
    fid.add_row("turns", str(ro.turns))
    fid.add_row("TITO segments (with drift)", f"{ro.segments} ({ro.segments_with_drift})")
    if ro.resumed or ro.resume_failed:  # a restart found live episodes in the journal
        fid.add_row("episodes resumed after a coordinator restart (turns lost, could not resume)",
                    f"{ro.resumed} ({ro.resume_turns_lost}, {ro.resume_failed})")
    fid.add_row("policy versions in training rollouts", ", ".join(map(str, ro.policy_versions)) or "-")
    return fid


def report_tables(report: RunReport) -> list[Table]:
    """Rich tables for a report (pure)."""
    tables = [eval_table(report, name) for name in _set_names(report)]
    if report.sft_curve:
        tables.append(sft_table(report.sft_curve, report.sft_kept_step))
    tables.append(fidelity_table(report))
    return tables


def last_line(report: RunReport) -> str:
    """The run's last printed line: where its report and its learning curves are."""
    if report.finished:
        parts = [f"t1: run {report.name} done"]
    else:
        parts = [f"t1: run {report.name} stopped before its end, at trainer step {report.trainer.step} of "
                 f"{report.planned_steps}"]
    if report.report_path:
        parts.append(f"report {report.report_path}")
    if report.curves_png:
        parts.append(f"learning curves {report.curves_png}")
    return " · ".join(parts)


PIPE_WIDTH = 120  # not a terminal (CI, a pipe, a file): wide enough that no table row wraps


def print_report(report: RunReport, console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=PIPE_WIDTH)
    for table in report_tables(report):
        console.print(table)
    for line in lift_lines(report) + shape_lines(report):
        console.print(line, markup=False, highlight=False)
    console.print(last_line(report), markup=False, highlight=False, soft_wrap=True)
