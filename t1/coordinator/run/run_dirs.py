"""Which run directory a training run uses, and whether it starts fresh or resumes: the run-again rule.

With `coordinator.runs_dir` set, every training run has a numbered directory of its own,
`<runs_dir>/<name>-<n>/`, holding its run log, spool, eval jobs, report and (for a trainer this
coordinator starts) the trainer's work dir `trainer/`; models and task sets stay where the config
puts them, shared by every run. The rule (`choose`):

- the newest run is unfinished (no report of a run whose trainer is done): resume it;
- otherwise (none yet, or the newest one finished): a fresh run, numbered one past the newest;
- `--fresh` always starts a new number; `--resume` resumes the newest run and is refused when it
  has finished or there is none.

Without `runs_dir` the configured `coordinator.run_dir` is the one run directory: it is resumed
when it holds an unfinished run, started in when empty, and a finished run there is refused (a
second start would otherwise skip training and report the old trainer as if it had trained now).

A run that another coordinator is running is "unfinished" too: resuming it is then refused by the
run dir's lock (t1.workdir.DirLock), naming that coordinator.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from t1.errors import BadRequest

REPORT = "report.json"
TRAINER_SUBDIR = "trainer"


class RunMode(StrEnum):
    AUTO = "auto"      # resume an unfinished run, else start fresh
    FRESH = "fresh"
    RESUME = "resume"


class RunDirError(BadRequest, ValueError):
    """The run-again rule cannot be followed; str(self) says why and what to do."""


@dataclass(frozen=True, slots=True)
class RunDirState:
    """What a run directory holds, read from its files."""

    path: Path
    started: bool              # it has a run log (a coordinator ran in it)
    finished: bool             # its report says the trainer finished
    trainer_step: int | None   # committed trainer steps in its work dir; None when not readable here


@dataclass(frozen=True, slots=True)
class RunChoice:
    path: Path
    fresh: bool
    state: RunDirState | None = None  # the state of the directory resumed


def finished(run_dir: Path) -> bool:
    """A run is finished when its report exists and names a trainer that reached DONE."""
    try:
        report = json.loads((run_dir / REPORT).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and report.get("trainer", {}).get("stage") == "done"


def committed_steps(trainer_dir: Path | None) -> int | None:
    """The trainer's committed steps (its buffer's steps table; 0 before it has one), or None when the trainer
    is not on this machine or its buffer cannot be read."""
    if trainer_dir is None:
        return None
    db = trainer_dir / "buffer.sqlite"
    if not db.is_file():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM steps").fetchone()[0])
    except sqlite3.Error:
        return None


def inspect(run_dir: Path, trainer_dir: Path | None) -> RunDirState:
    return RunDirState(run_dir, (run_dir / "run.jsonl").is_file(), finished(run_dir), committed_steps(trainer_dir))


def numbered(runs_dir: Path, name: str) -> dict[int, Path]:
    """Existing `<name>-<n>` directories under runs_dir, by n."""
    pattern = re.compile(rf"^{re.escape(name)}-(\d+)$")
    found: dict[int, Path] = {}
    if runs_dir.is_dir():
        for entry in runs_dir.iterdir():
            m = pattern.match(entry.name)
            if m and entry.is_dir():
                found[int(m.group(1))] = entry
    return found


def choose(runs_dir: Path, name: str, mode: RunMode, local_trainer: bool = True) -> RunChoice:
    """The run directory under runs_dir for this start (see the module docstring for the rule);
    local_trainer: the trainer's work dir is the run's own (else its steps are not readable here)."""
    runs = numbered(runs_dir, name)
    newest = max(runs) if runs else 0
    state = inspect(runs[newest], runs[newest] / TRAINER_SUBDIR if local_trainer else None) if runs else None
    if state is not None and not state.started and not state.trainer_step:
        # a directory made for a run that never got going (it failed at start): the next run takes it
        if mode is RunMode.RESUME:
            raise RunDirError(f"--resume: {state.path} holds no run to resume; start one without --resume")
        return RunChoice(state.path, fresh=True)
    if mode is RunMode.RESUME:
        if state is None:
            raise RunDirError(f"--resume: no run named {name} in {runs_dir} to resume; start one without --resume")
        if state.finished:
            raise RunDirError(f"--resume: {state.path} has finished (its report is {state.path / REPORT}); "
                              "start a fresh run without --resume")
        return RunChoice(state.path, fresh=False, state=state)
    if mode is RunMode.AUTO and state is not None and not state.finished:
        return RunChoice(state.path, fresh=False, state=state)
    return RunChoice(runs_dir / f"{name}-{newest + 1}", fresh=True)


def choose_fixed(run_dir: Path, trainer_dir: Path | None, mode: RunMode) -> RunChoice:
    """The rule for one configured run directory (no runs_dir): resume, or start in an empty one."""
    state = inspect(run_dir, trainer_dir)
    if state.finished:
        raise RunDirError(f"{run_dir} holds a finished run (its report is {run_dir / REPORT}); a second run "
                          "there would not train again: set coordinator.runs_dir for numbered runs, or give "
                          "coordinator.run_dir (and trainer.work_dir) another directory")
    if state.started or state.trainer_step:
        if mode is RunMode.FRESH:
            raise RunDirError(f"--fresh: {run_dir} holds an unfinished run; resume it without --fresh, or set "
                              "coordinator.runs_dir for numbered runs")
        return RunChoice(run_dir, fresh=False, state=state)
    if mode is RunMode.RESUME:
        raise RunDirError(f"--resume: {run_dir} holds no run to resume")
    return RunChoice(run_dir, fresh=True)


def first_line(choice: RunChoice, total_steps: int) -> str:
    """What a training run prints first: a fresh run, or the run it resumes and where its trainer is."""
    if choice.fresh:
        return f"t1: fresh run in {choice.path}"
    step = choice.state.trainer_step if choice.state is not None else None
    where = f"trainer at step {step} of {total_steps}" if step is not None else "the trainer is not on this machine"
    return f"t1: resuming {choice.path} ({where})"
