"""What a learning run on the long tier (examples/long.yaml) shows beyond its solve rates, read from its run dir.

Per evaluated policy: turns and segments per episode (the eval summary's median and p90), the share of its
compaction summaries that carry what a later step needs, TITO drift per segment and routing replay coverage.

A summary carries what a later step needs when it holds, as a word, the task's early value (`early_value`: the
file_chain target, the job_queue ticket, the staged_start key), counted over the well-formed summaries written
after the value was shown (the last step uses it: every summary before the end needs it). Malformed summaries (the
rule's note replaced them) are counted apart. The summaries are read from the eval episodes' transcripts (the
`> compaction summary (...): TEXT` notes): the run keeps those, not the journals.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t1.evals.stats import task_family
from t1.tasks.synth.long_tier import early_value

_SUMMARY_NOTE = re.compile(r"^> compaction summary \((?P<head>[^)]*)\): (?P<text>.*)$")
COVERAGE_KEY = "routing_replay_coverage"


@dataclass(frozen=True, slots=True)
class SummaryTally:
    """The summaries of some episodes: the ones a later step needed, how many of those carried the value, and
    how many summaries were malformed (the rule's note instead)."""

    needed: int = 0
    carried: int = 0
    malformed: int = 0

    def __add__(self, other: SummaryTally) -> SummaryTally:
        return SummaryTally(self.needed + other.needed, self.carried + other.carried, self.malformed + other.malformed)

    def as_dict(self) -> dict[str, Any]:
        share = self.carried / self.needed if self.needed else None
        return {"needed": self.needed, "carried": self.carried, "carry_share": share, "malformed": self.malformed}


def _has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(word)}(?![\w])", text) is not None


def summary_tally(transcript: str, value: str) -> SummaryTally:
    """The summaries of one episode's transcript against the value a later step needs (pure)."""
    needed = carried = malformed = 0
    shown = False
    for line in transcript.split("\n"):
        note = _SUMMARY_NOTE.match(line)
        if note is None:
            shown = shown or _has_word(line, value)
            continue
        if "malformed" in note["head"]:
            malformed += 1
        elif shown:
            needed += 1
            carried += _has_word(note["text"], value)
    return SummaryTally(needed, carried, malformed)


def task_files(task_dir: Path) -> dict[str, str]:
    """The text files a task puts in /app (its folder's environment/files), by path."""
    root = task_dir / "environment" / "files"
    return {str(p.relative_to(root)): p.read_text(errors="replace") for p in sorted(root.rglob("*")) if p.is_file()}


def carry_of_job(transcripts: Path, tasks_dir: Path) -> dict[str, Any]:
    """The summary tally of an eval job's transcripts (`<transcripts>/<task id>/<episode>.md`), overall and per
    long-tier family; tasks outside the long tier are skipped."""
    by_family: dict[str, SummaryTally] = {}
    for task_dir in sorted(p for p in transcripts.iterdir() if p.is_dir()) if transcripts.is_dir() else []:
        family = task_family(task_dir.name)
        value = early_value(family, task_files(tasks_dir / task_dir.name))
        if value is None:
            continue
        for episode in sorted(task_dir.glob("*.md")):
            by_family[family] = by_family.get(family, SummaryTally()) + summary_tally(episode.read_text(), value)
    total = sum(by_family.values(), SummaryTally())
    return {**total.as_dict(), "by_family": {f: t.as_dict() for f, t in sorted(by_family.items())}}


def replay_coverage(run_log: Path) -> float | None:
    """The lowest routing replay coverage of any trainer step the run log recorded (None when none did)."""
    values: list[float] = []
    if run_log.is_file():
        for line in run_log.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") == "trainer":
                values += [float(v) for k, v in record.get("metrics", {}).items() if k.endswith(COVERAGE_KEY)]
    return min(values) if values else None


def long_stats(run_dir: Path, report: dict[str, Any], tasks_dir: Path, labels: Iterable[str],
               set_name: str = "heldout") -> dict[str, Any]:
    """Per evaluated policy: turns and segments per episode and the summary tally; for the run: TITO drift per
    segment (every episode of the run) and the lowest routing replay coverage of its trainer steps."""
    per_label = {}
    for label in labels:
        summary = report.get(label, {}).get(set_name)
        if summary is None:
            continue
        job_dir = run_dir / "transcripts" / "eval" / str(summary.get("job_id", ""))
        per_label[label] = {"turns": summary.get("turns", {}), "segments": summary.get("segments", {}),
                            "summaries": carry_of_job(job_dir, tasks_dir)}
    rollouts = report.get("rollouts", {})
    return {"evals": per_label, "segments": rollouts.get("segments"),
            "segments_with_drift": rollouts.get("segments_with_drift"),
            "tito_drift_tokens": report.get("fidelity", {}).get("t1_tito_drift_tokens"),
            "routing_replay_coverage_min": replay_coverage(run_dir / "run.jsonl")}
