"""The run's report as a value: its evals by policy label, the SFT curve, the trainer's state, the fidelity metrics
and the rollout totals.

`RunReport.to_json()` is report.json and the run log's `report` record (bench/learning.py, t1 view and the
docs read its keys); stages.write_report builds it, console_report.py prints it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from t1.coordinator.run.sft_steer import CurvePoint
from t1.evals.stats import EvalSummary

EvalsByLabel = dict[str, dict[str, EvalSummary]]
"""The evaluated policies: label (base, warm_start, rl; before, after) -> task set name -> its eval's summary."""


@dataclass(frozen=True, slots=True)
class TrainerAtEnd:
    """Where the trainer was when the report was written."""

    step: int
    stage: str
    policy_version: int


@dataclass(frozen=True, slots=True)
class RolloutTotals:
    """The run's episodes, all stages: counts from the rollout runner, the journal's recovery and the spool."""

    episodes: int
    turns: int
    infra_errors: int
    resumed: int                          # episodes a dead coordinator left that continued from their last turn
    resume_turns_lost: int
    resume_failed: int
    journal_recovered: Mapping[str, int]  # what the journal's recovery found at the start (Recovered.summary)
    spool_pending: int
    policy_versions: tuple[int, ...]      # the versions that sampled training tokens, ascending
    training: Mapping[str, float]         # cumulative tallies of scored training episodes
    gateway_segments: Mapping[str, int] = field(default_factory=dict)  # harness episodes' segment starts by cause
    segments: int = 0                     # TITO segments of every episode's trajectory
    segments_with_drift: int = 0          # of those, segments with TITO drift (must be 0)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "episodes": self.episodes, "turns": self.turns, "infra_errors": self.infra_errors,
            "segments": self.segments, "segments_with_drift": self.segments_with_drift, "resumed": self.resumed,
            "resume_turns_lost": self.resume_turns_lost, "resume_failed": self.resume_failed,
            "journal_recovered": dict(self.journal_recovered), "spool_pending": self.spool_pending,
            "policy_versions": list(self.policy_versions), "training": dict(self.training)}
        if self.gateway_segments:
            out["gateway_segments"] = dict(sorted(self.gateway_segments.items()))
        return out


@dataclass(frozen=True, slots=True)
class RunReport:
    """What a training run reports at its end (`finished` False: stopped before it, at `trainer.step`)."""

    name: str
    evals: EvalsByLabel
    trainer: TrainerAtEnd
    fidelity: Mapping[str, float]  # the trainer's last fidelity metrics, and the run's TITO counts
    rollouts: RolloutTotals
    finished: bool = True
    planned_steps: int = 0
    sft_curve: tuple[CurvePoint, ...] = ()
    sft_kept_step: int | None = None  # the warm start: the best validation round's weights (steered SFT)
    curves_png: str = ""              # the learning curves; "" when they could not be drawn
    report_path: str = ""             # report.json; "" when it could not be written

    def to_json(self) -> dict[str, Any]:
        """report.json: the eval labels are top-level keys, each {set name: summary}."""
        out: dict[str, Any] = {"name": self.name}
        out.update({label: {name: s.as_dict() for name, s in sets.items()} for label, sets in self.evals.items()})
        out.update(finished=self.finished, planned_steps=self.planned_steps,
                   sft_curve=[asdict(p) for p in self.sft_curve])
        if self.sft_kept_step is not None:
            out["sft_kept_step"] = self.sft_kept_step
        out.update(trainer=asdict(self.trainer), fidelity=dict(self.fidelity), rollouts=self.rollouts.to_json())
        if self.curves_png:
            out["curves_png"] = self.curves_png
        out["report_path"] = self.report_path
        return out
