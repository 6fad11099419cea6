"""The run page's data as pure functions of the index: curves, the stage timeline, eval comparisons.

Trainer curves come from the trainer's committed steps (every step, exact), falling back to the
run log's `trainer` records when the trainer's buffer is not readable; rollout curves from the
run log's `status` records; reward and solve rate from the episode rows, by the policy version
that sampled them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from t1.evals.results import AttemptOutcome, summarize
from t1.trainer.buffer import StepRecord
from t1.view.episodes import EpisodeRow, Source
from t1.view.sources import JobRow


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    x: tuple[float, ...]
    y: tuple[float | None, ...]  # None where the value was not finite (a gap)

    @property
    def num_points(self) -> int:
        return sum(v is not None for v in self.y)


@dataclass(frozen=True, slots=True)
class Chart:
    key: str
    title: str
    x_label: str
    series: tuple[Series, ...]

    @property
    def num_points(self) -> int:
        return sum(s.num_points for s in self.series)

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "x_label": self.x_label,
                "series": [{"name": s.name, "x": list(s.x), "y": list(s.y)} for s in self.series]}


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


# chart key, title, the step-metric keys it draws (the first present of each alias list)
TRAINER_CHARTS: tuple[tuple[str, str, tuple[tuple[str, ...], ...]], ...] = (
    ("kl", "KL", (("kl", "t1_kl"), ("approx_kl",))),
    ("logprob_diff", "Train-inference |dlogp|",
     (("t1_train_infer_logprob_abs_diff", "logprob_abs_diff"), ("t1_train_infer_logprob_abs_diff_max",))),
    ("entropy", "Entropy", (("entropy",),)),
    ("clip_fraction", "Clip fraction", (("clip_fraction", "t1_clip_fraction"),)),
    ("explained_variance", "Explained variance", (("explained_variance", "t1_explained_variance"),)),
    ("policy_lag", "Policy lag", (("policy_lag", "t1_policy_lag"), ("policy_lag_max",))),
)
STATUS_CHARTS: tuple[tuple[str, str, str], ...] = (
    ("turns_per_s", "Turns/s", "turns_per_s"),
    ("infra_failure_rate", "Infra failure rate", "infra_failure_rate"),
)


def trainer_points(steps: Sequence[StepRecord], records: Iterable[Mapping[str, Any]]) -> list[tuple[int, Mapping]]:
    """(step, metrics) of every trainer step: the buffer's steps, else the run log's trainer records."""
    if steps:
        return [(s.step, s.metrics) for s in steps]
    last: dict[int, Mapping[str, Any]] = {}
    for r in records:
        if r.get("event") == "trainer" and r.get("metrics"):
            last[int(r["step"])] = r["metrics"]
    return sorted(last.items())


ChartTable = Sequence[tuple[str, str, tuple[tuple[str, ...], ...]]]


def trainer_charts(points: Sequence[tuple[int, Mapping[str, Any]]], table: ChartTable = TRAINER_CHARTS) -> list[Chart]:
    """One chart per table entry: a series per alias list whose first present name a step metric has."""
    charts = []
    for key, title, aliases in table:
        series = []
        for names in aliases:
            name = next((n for n in names if any(n in m for _, m in points)), None)
            if name is None:
                continue
            xs = [(step, _finite(m[name])) for step, m in points if name in m]
            series.append(Series(name, tuple(float(x) for x, _ in xs), tuple(y for _, y in xs)))
        charts.append(Chart(key, title, "trainer step", tuple(series)))
    return charts


def status_charts(records: Sequence[Mapping[str, Any]]) -> list[Chart]:
    status = [r for r in records if r.get("event") == "status"]
    t0 = records[0]["ts"] if records else 0.0
    charts = []
    for key, title, field in STATUS_CHARTS:
        xs = [(round((r["ts"] - t0) / 60.0, 4), _finite(r.get(field))) for r in status if field in r]
        charts.append(Chart(key, title, "minutes since start",
                            (Series(field, tuple(x for x, _ in xs), tuple(y for _, y in xs)),) if xs else ()))
    return charts


def reward_chart(rows: Iterable[EpisodeRow]) -> Chart:
    """Mean reward and solve rate of training episodes (infra errors excluded), by sampling policy version."""
    by_version: dict[int, list[EpisodeRow]] = defaultdict(list)
    for r in rows:
        if r.source is Source.TRAIN and not r.infra_error and r.max_version >= 0:
            by_version[r.max_version].append(r)
    versions = sorted(by_version)
    reward = tuple(sum(r.reward for r in by_version[v]) / len(by_version[v]) for v in versions)
    solved = tuple(sum(r.solved for r in by_version[v]) / len(by_version[v]) for v in versions)
    xs = tuple(float(v) for v in versions)
    series = (Series("mean reward", xs, reward), Series("solve rate", xs, solved)) if versions else ()
    return Chart("reward", "Reward and solve rate (training episodes)", "policy version", series)


def run_charts(
    records: Sequence[Mapping[str, Any]], steps: Sequence[StepRecord], rows: Iterable[EpisodeRow]
) -> list[Chart]:
    """Every chart of the run page, in page order."""
    trainer = trainer_charts(trainer_points(steps, records))
    status = status_charts(records)
    return [reward_chart(rows), *trainer[:2], *status[:1], *trainer[2:], *status[1:]]


@dataclass(frozen=True, slots=True)
class StageSpan:
    stage: str
    start_s: float
    end_s: float


def stage_timeline(records: Sequence[Mapping[str, Any]]) -> list[StageSpan]:
    """Contiguous stages from the run log's status records (seconds since the first record)."""
    if not records:
        return []
    t0 = records[0]["ts"]
    spans: list[StageSpan] = []
    for r in records:
        stage = r.get("stage") if r.get("event") == "status" else None
        t = r["ts"] - t0
        if spans:
            spans[-1] = StageSpan(spans[-1].stage, spans[-1].start_s, t)
        if stage and (not spans or spans[-1].stage != stage):
            spans.append(StageSpan(stage, t, t))
    return spans


@dataclass(frozen=True, slots=True)
class EvalRow:
    job_id: str
    name: str
    label: str
    task_set: str
    state: str
    num_tasks: int
    attempts: int
    resolve_rate: float
    mean_reward: float
    pass_at_k: tuple[tuple[int, float], ...]
    infra_errors: int


def eval_rows(jobs: Sequence[tuple[JobRow, list[tuple[AttemptOutcome, float]]]]) -> list[EvalRow]:
    """One row per eval job; the run's own evals are named `<label>:<set>` (before = base, after = RL)."""
    out = []
    for job, attempts in jobs:
        s = summarize([o for o, _ in attempts], job.attempts_per_task)
        label, _, task_set = job.name.partition(":") if ":" in job.name else ("", "", job.name)
        out.append(EvalRow(job.job_id, job.name, label, task_set, job.state, job.num_tasks, len(attempts),
                           s.resolve_rate, s.mean_reward, tuple(sorted(s.pass_at_k.items())), s.infra_errors))
    return out


LABEL_NAMES = {"before": "base", "base": "base", "warm": "warm start", "warm_start": "warm start", "after": "RL",
               "rl": "RL"}


def comparison(rows: Sequence[EvalRow]) -> tuple[list[str], list[tuple[str, list[EvalRow | None]]]]:
    """Columns (labels in run order) and, per task set, the latest job of each label."""
    labels: list[str] = []
    table: dict[str, dict[str, EvalRow]] = {}
    for r in rows:
        if not r.label:
            continue
        if r.label not in labels:
            labels.append(r.label)
        table.setdefault(r.task_set, {})[r.label] = r
    return labels, [(s, [by.get(lbl) for lbl in labels]) for s, by in table.items()]
