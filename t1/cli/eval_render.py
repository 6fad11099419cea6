"""Renderings of eval jobs for the CLI: per-attempt tables (rich, Markdown, CSV) and JSON, as pure functions."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from google.protobuf.json_format import MessageToDict
from rich.table import Table

from t1.v1 import coordinator_pb2 as pb

COLUMNS = ("task_id", "attempt", "status", "resolved", "reward", "passed", "total", "turns", "tokens", "duration_s",
           "failure_mode", "why")


def state_name(state: int) -> str:
    return pb.JobState.Name(state).removeprefix("JOB_STATE_").lower()


def _row(a: pb.AttemptResult) -> list[str]:
    return [a.task_id, str(a.attempt), a.status, "yes" if a.resolved else "no", f"{a.reward:g}", str(a.passed),
            str(a.total), str(a.turns), str(a.tokens), f"{a.duration_s:.1f}", a.failure_mode, a.why]


def _short(row: list[str], width: int = 60) -> list[str]:
    return [c if len(c) <= width else c[: width - 1] + "…" for c in row]


def summary_lines(job: pb.EvalJob) -> list[str]:
    s = job.summary
    lines = [
        f"job {job.job_id} ({job.request.name or job.request.tasks}): {state_name(job.state)}, "
        f"{job.finished_attempts}/{job.total_attempts} attempts",
        f"resolve rate {s.resolve_rate:.3f}  mean reward {s.mean_reward:.3f}  tasks {s.num_tasks}  "
        f"infra errors {s.infra_errors}",
    ]
    if s.pass_at_k:
        lines.append("  ".join(f"pass@{k} {v:.3f}" for k, v in sorted(s.pass_at_k.items())))
    if job.request.HasField("openai_endpoint"):
        ep = job.request.openai_endpoint
        level = "text-level (no exact tokens)" if (ep.api or "chat") == "chat" else "token-level"
        lines.append(f"endpoint {ep.base_url} model {ep.model}: {level}")
    if job.error:
        lines.append(f"error: {job.error}")
    return lines


def _sorted(job: pb.EvalJob) -> list[pb.AttemptResult]:
    return sorted(job.attempts, key=lambda a: (a.task_id, a.attempt))


def as_table(job: pb.EvalJob) -> Table:
    table = Table(title="\n".join(summary_lines(job)), title_justify="left")
    for col in COLUMNS:
        table.add_column(col, justify="right" if col not in ("task_id", "status", "failure_mode", "why") else "left")
    for a in _sorted(job):
        table.add_row(*_short(_row(a)))
    return table


def as_markdown(job: pb.EvalJob) -> str:
    out = [f"## Eval {job.job_id}", "", *[f"- {line}" for line in summary_lines(job)], "",
           "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in _row(a)) + " |" for a in _sorted(job)]
    return "\n".join(out) + "\n"


def as_csv(job: pb.EvalJob) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for a in _sorted(job):
        writer.writerow(_row(a))
    return buf.getvalue()


def as_json(job: pb.EvalJob) -> str:
    data: dict[str, Any] = MessageToDict(
        job, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
