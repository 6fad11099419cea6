"""The end-of-run report on the console: resolve rate before and after training, and the fidelity metrics."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def report_tables(report: dict[str, Any]) -> list[Table]:
    """Rich tables for a report dict as stages.train_run writes it (pure)."""
    before, after = report.get("before", {}), report.get("after", {})
    evals = Table(title=f"Run {report.get('name', '')}: held-out resolve rate", title_justify="left")
    for col in ("task set", "before", "after", "change", "pass@1 after", "infra errors"):
        evals.add_column(col, justify="left" if col == "task set" else "right")
    for name in sorted(set(before) | set(after)):
        b, a = before.get(name), after.get(name)
        rb = f"{b['resolve_rate']:.3f}" if b else "-"
        ra = f"{a['resolve_rate']:.3f}" if a else "-"
        delta = f"{a['resolve_rate'] - b['resolve_rate']:+.3f}" if a and b else "-"
        p1 = a["pass_at_k"].get(1) if a else None
        evals.add_row(name, rb, ra, delta, f"{p1:.3f}" if p1 is not None else "-",
                      str((a or b or {}).get("infra_errors", 0)))
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
    fid.add_row("policy versions in training rollouts", ", ".join(map(str, ro.get("policy_versions", []))) or "-")
    return [evals, fid]


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    for table in report_tables(report):
        console.print(table)
