"""The viewer's index of a run directory: episode rows, run-log records, trainer steps, eval jobs.

Built once at start and brought up to date incrementally (at most once per `refresh_s`, when a
page is asked for): the run log and spool files are read from where the last refresh stopped,
the trainer buffer from its last sequence number, so a live run is followed at the cost of what
is new. Pages are served from the index; a trajectory record is read again only for its own
episode page. The index only reads (t1/view/sources.py).

Episodes come from the trainer buffer (every trajectory the trainer accepted), the spool (those
not yet accepted), the warm start's demonstrations, and eval jobs' attempts (summary rows; the
coordinator keeps no tokens of eval episodes). A transcript is looked up where the coordinator
writes it (transcripts/<train|demos|eval/JOB>/<task>/<episode>.md) when its page is opened.
"""

from __future__ import annotations

import glob
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from t1.evals.results import AttemptOutcome
from t1.evals.stats import task_family
from t1.trainer.buffer import StepRecord
from t1.trajectory.serialization import CodecError, decode_trajectory
from t1.view import sources as src
from t1.view.episodes import EpisodeRow, Source, summarize
from t1.view.sources import JobRow, Locator

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunPaths:
    run_dir: Path
    trainer_dir: Path | None = None  # the trainer's work_dir (its buffer.sqlite); found from the run log if None

    @property
    def buffer_db(self) -> Path | None:
        return self.trainer_dir / src.BUFFER_DB if self.trainer_dir is not None else None


@dataclass(slots=True)
class _Cursor:
    run_log: int = 0
    spool: dict[Path, int] = field(default_factory=dict)
    buffer_seq: int = 0
    demos_size: int = -1
    jobs_mtime: float = -1.0


class RunIndex:
    """Thread-safe: the server's request threads call `refresh` and read the snapshot lists."""

    def __init__(self, paths: RunPaths, refresh_s: float = 1.0) -> None:
        self.paths = paths
        self.refresh_s = refresh_s
        self.records: list[dict[str, Any]] = []
        self.steps: list[StepRecord] = []
        self.jobs: list[tuple[JobRow, list[tuple[AttemptOutcome, float]]]] = []
        self._episodes: dict[str, EpisodeRow] = {}
        self.episodes: list[EpisodeRow] = []
        self._transcripts: dict[str, Path] = {}
        self._facets: tuple[int, dict[str, list[str]]] = (-1, {})
        self._cur = _Cursor()
        self._lock = threading.Lock()
        self._last_refresh = -1e18
        self.generation = 0  # bumps whenever anything new was read
        self.refresh(force=True)

    # -- refresh -------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_refresh < self.refresh_s:
            return
        with self._lock:
            if not force and now - self._last_refresh < self.refresh_s:
                return
            self._last_refresh = now
            changed = self._read_run_log()
            changed |= self._read_buffer() | self._read_spool() | self._read_demos() | self._read_jobs()
            if changed:
                self.episodes = sorted(self._episodes.values(), key=lambda r: (r.finished, r.id))
                self.generation += 1

    def _read_run_log(self) -> bool:
        records, self._cur.run_log = src.read_jsonl_from(self.paths.run_dir / src.RUN_LOG, self._cur.run_log)
        self.records.extend(records)
        if self.paths.trainer_dir is None:
            # <work_dir>/weights/v<N> in a weights record: the trainer's buffer lives in <work_dir>; else a
            # numbered run's own (<run_dir>/trainer), or the fixed layout (.t1/run beside .t1/trainer)
            found = [Path(r["path"]).parent.parent for r in records if r.get("event") == "weights" and r.get("path")]
            for candidate in [*found, self.paths.run_dir / "trainer", self.paths.run_dir.parent / "trainer"]:
                if (candidate / src.BUFFER_DB).is_file():
                    self.paths = replace(self.paths, trainer_dir=candidate)
                    break
        return bool(records)

    def _add(self, row: EpisodeRow) -> None:
        self._episodes[row.id] = row

    def _read_buffer(self) -> bool:
        db = self.paths.buffer_db
        if db is None or not db.is_file():
            return False
        new_rows = 0
        for r in src.buffer_rows_after(db, self._cur.buffer_seq):
            self._cur.buffer_seq = r.seq
            new_rows += 1
            try:
                t = decode_trajectory(r.payload)
            except CodecError as exc:
                log.warning("%s: trajectory %s is not readable: %s", db, r.id, exc)
                continue
            self._add(replace(summarize(t, Source.TRAIN, "train", Locator(db, row_id=r.id), r.received),
                              trained_step=r.consumed_step))
        changed = bool(new_rows) or src.buffer_step_count(db) != len(self.steps)
        if changed:
            self.steps = src.buffer_steps(db)
            consumed = src.buffer_consumed(db)
            for eid, step in consumed.items():
                row = self._episodes.get(eid)
                if row is not None and row.trained_step != step:
                    self._episodes[eid] = replace(row, trained_step=step)
        return changed

    def _read_spool(self) -> bool:
        changed = False
        for path in src.spool_files(self.paths.run_dir):
            start = self._cur.spool.get(path, 0)
            try:
                size = path.stat().st_size
            except FileNotFoundError:  # acknowledged and deleted meanwhile
                continue
            if size == start:
                continue
            frames, self._cur.spool[path] = src.spool_frames_from(path, start)
            mtime = path.stat().st_mtime
            for tid, loc in frames:
                if tid in self._episodes:
                    continue  # the trainer already has it: the buffer's copy is the durable one
                try:
                    t = src.read_locator(loc)
                except CodecError as exc:
                    log.warning("%s: trajectory %s is not readable: %s", path, tid, exc)
                    continue
                self._add(summarize(t, Source.TRAIN, "train", loc, mtime))
                changed = True
        return changed

    def _read_demos(self) -> bool:
        path = self.paths.run_dir / src.DEMOS
        size = path.stat().st_size if path.is_file() else -1
        if size == self._cur.demos_size:
            return False
        self._cur.demos_size = size
        if size <= 0:
            return False
        mtime = path.stat().st_mtime
        for t, loc in src.demo_records(path):
            self._add(replace(summarize(t, Source.DEMO, "train", loc, mtime), subdir="demos"))
        return True

    def _read_jobs(self) -> bool:
        db = self.paths.run_dir / src.JOBS_DB
        if not db.is_file():
            return False
        wal = db.with_name(db.name + "-wal")
        mtime = max(db.stat().st_mtime, wal.stat().st_mtime if wal.is_file() else 0.0)
        if mtime == self._cur.jobs_mtime:
            return False
        self._cur.jobs_mtime = mtime
        self.jobs = src.eval_jobs(db)
        for job, attempts in self.jobs:
            for o, finished in attempts:
                # the coordinator's names: group eval-<job>-<task>, episode <group>-a<k>-<hex>
                # (hex: in the transcript's name)
                group = f"eval-{job.job_id}-{o.task_id}"
                self._add(EpisodeRow(
                    id=f"{group}-a{o.attempt}", task_id=o.task_id, family=task_family(o.task_id), split="eval",
                    source=Source.EVAL, group_id=group, attempt=o.attempt, status=o.status, reward=o.reward,
                    passed=o.passed, total=o.total, num_turns=o.turns, num_tokens=o.tokens, num_segments=0,
                    min_version=-1, max_version=-1, finished=finished, subdir=f"eval/{job.job_id}"))
        return True

    # -- reads -----------------------------------------------------------------------------------
    def transcript_path(self, row: EpisodeRow) -> Path | None:
        """The episode's transcript, where the coordinator writes it (None while there is none)."""
        found = self._transcripts.get(row.id)
        if found is not None:
            return found
        folder = self.paths.run_dir / src.TRANSCRIPTS / row.subdir / row.task_id.replace("/", "__")
        if row.source is Source.EVAL:  # a resumed attempt may have left more than one: the latest is the result
            hits = sorted(folder.glob(f"{glob.escape(row.id)}-*.md"), key=lambda p: p.stat().st_mtime)
            path = hits[-1] if hits else None
        else:
            path = folder / f"{row.id}.md"
        if path is None or not path.is_file():
            return None
        self._transcripts[row.id] = path
        return path

    def episode(self, episode_id: str) -> EpisodeRow | None:
        return self._episodes.get(episode_id)

    def group(self, group_id: str) -> list[EpisodeRow]:
        return sorted((r for r in self.episodes if r.group_id == group_id), key=lambda r: r.attempt)

    def facets(self) -> dict[str, list[str]]:
        """Distinct values of the filterable columns (for the filter form)."""
        generation, facets = self._facets
        if generation != self.generation:
            rows = self.episodes
            facets = {"family": sorted({r.family for r in rows}), "split": sorted({r.split for r in rows}),
                      "status": sorted({str(r.status) for r in rows}),
                      "source": sorted({str(r.source) for r in rows})}
            self._facets = (self.generation, facets)
        return facets
