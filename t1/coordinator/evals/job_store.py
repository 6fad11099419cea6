"""The eval job store: jobs and every finished attempt in SQLite, so a restarted coordinator resumes.

An attempt row is written (and committed with synchronous=FULL) the moment the attempt
finishes; the primary key (job, task, attempt) makes a second write of the same attempt a
no-op, and a resumed job runs only the attempts that have no row.

Every method is a short blocking transaction behind one lock: callers on the event loop run
them with `asyncio.to_thread`. Reads that serve listings never load attempt rows: a job's
summary comes from per-task tallies (one row per task), so a page of jobs costs the same
whatever their attempt counts. A file SQLite cannot read raises StorageError naming it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from t1.evals.results import AttemptOutcome, TaskTally
from t1.trajectory.types import EpisodeStatus
from t1.workdir import StorageError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    request BLOB NOT NULL,
    task_ids TEXT NOT NULL,
    attempts_per_task INTEGER NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    error TEXT NOT NULL DEFAULT '',
    resumes INTEGER NOT NULL DEFAULT 0,
    unclean_resumes INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL REFERENCES jobs(job_id),
    task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    reward REAL NOT NULL,
    passed INTEGER NOT NULL,
    total INTEGER NOT NULL,
    status TEXT NOT NULL,
    turns INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    duration_s REAL NOT NULL,
    failure_mode TEXT NOT NULL,
    resolved INTEGER NOT NULL,
    finished REAL NOT NULL,
    details TEXT NOT NULL DEFAULT '{}',
    segments INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, task_id, attempt)
);
"""


_ATTEMPT_COLUMNS = ("task_id, attempt, reward, passed, total, status, turns, tokens, duration_s, failure_mode, "
                    "resolved, details, segments")
_JOB_COLUMNS = ("job_id, name, state, request, task_ids, attempts_per_task, created, updated, error, resumes, "
                "unclean_resumes")
_ADDED_COLUMNS = {"attempts": {"details": "TEXT NOT NULL DEFAULT '{}'", "segments": "INTEGER NOT NULL DEFAULT 0"},
                  "jobs": {"resumes": "INTEGER NOT NULL DEFAULT 0", "unclean_resumes": "INTEGER NOT NULL DEFAULT 0"}}
"""Columns a store written by an earlier T1 lacks, added when it is opened (its rows read segments 0: not recorded)."""


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job row: the request (serialized SubmitEvalRequest bytes) and the resolved task list."""

    job_id: str
    name: str
    state: JobState
    request: bytes
    task_ids: tuple[str, ...]
    attempts_per_task: int
    created: float
    updated: float
    error: str = ""
    resumes: int = 0
    """How many times a restarted coordinator resumed the job."""
    unclean_resumes: int = 0
    """Of those, how many followed a coordinator that died while the job ran (`t1.coordinator.evals.crash`)."""

    @property
    def total_attempts(self) -> int:
        return len(self.task_ids) * self.attempts_per_task


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of a listing, newest first; `next_token` is "" on the last page."""

    jobs: tuple[JobRecord, ...]
    next_token: str


class JobStore:
    """One SQLite file; every method is one short transaction, safe to call from any thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            for table, added in _ADDED_COLUMNS.items():
                columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
                for name, kind in added.items():
                    if name not in columns:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
            self._db.execute("SELECT COUNT(*) FROM jobs").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StorageError(f"eval job database {path}: {exc} (move the file aside to start with an empty "
                               "one; its finished attempts are then no longer resumed)") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def size_bytes(self) -> int:
        """The database's bytes on disk, its write-ahead log included."""
        return sum(p.stat().st_size for p in (self.path, self.path.with_name(self.path.name + "-wal")) if p.exists())

    def _run(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.DatabaseError as exc:
                raise StorageError(f"eval job database {self.path}: {exc}") from None

    def _write(self, statements: list[tuple[str, tuple]]) -> int:
        """Run statements in one transaction; returns the first one's row count."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    counts = [self._db.execute(sql, args).rowcount for sql, args in statements]
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
            except sqlite3.DatabaseError as exc:
                raise StorageError(f"eval job database {self.path}: {exc}") from None
        return counts[0]

    def create_job(self, name: str, request: bytes, task_ids: list[str], attempts_per_task: int) -> JobRecord:
        now = time.time()
        job_id = f"job-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{uuid.uuid4().hex[:6]}"
        rec = JobRecord(job_id, name or job_id, JobState.QUEUED, request, tuple(task_ids), attempts_per_task, now, now)
        self._write([(f"INSERT INTO jobs ({_JOB_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      (rec.job_id, rec.name, rec.state.value, rec.request, json.dumps(list(rec.task_ids)),
                       rec.attempts_per_task, rec.created, rec.updated, "", 0, 0))])
        return rec

    def set_state(self, job_id: str, state: JobState, error: str = "") -> None:
        self._write([("UPDATE jobs SET state = ?, error = ?, updated = ? WHERE job_id = ?",
                      (state.value, error, time.time(), job_id))])

    def count_resume(self, job_id: str, unclean: bool) -> JobRecord:
        """One more resume of the job (`unclean`: after a coordinator that died while it ran); the job as now stored."""
        self._write([("UPDATE jobs SET resumes = resumes + 1, unclean_resumes = unclean_resumes + ?, updated = ? "
                      "WHERE job_id = ?", (int(unclean), time.time(), job_id))])
        record = self.get(job_id)
        if record is None:
            raise KeyError(job_id)
        return record

    def record_attempt(self, job_id: str, o: AttemptOutcome) -> bool:
        """Store a finished attempt; False when it was already stored (never overwritten)."""
        now = time.time()
        return self._write([
            (f"INSERT OR IGNORE INTO attempts (job_id, finished, {_ATTEMPT_COLUMNS}) VALUES "
             "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
             (job_id, now, o.task_id, o.attempt, o.reward, o.passed, o.total, o.status.value, o.turns, o.tokens,
              o.duration_s, o.failure_mode, int(o.resolved), _details(o), o.segments)),
            ("UPDATE jobs SET updated = ? WHERE job_id = ?", (now, job_id)),
        ]) == 1

    def get(self, job_id: str) -> JobRecord | None:
        rows = self._run(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,))
        return _job(rows[0]) if rows else None

    def list_jobs(self, states: set[JobState] | None = None, limit: int = 100, page_token: str = "") -> JobPage:
        """Newest first, `limit` per page; pass the returned token to get the next page."""
        where, args = _state_filter(states)
        if page_token:
            created, job_id = _parse_token(page_token)
            where.append("(created < ? OR (created = ? AND job_id < ?))")
            args += [created, created, job_id]
        sql = f"SELECT {_JOB_COLUMNS} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._run(sql + " ORDER BY created DESC, job_id DESC LIMIT ?", (*args, limit + 1))
        jobs = tuple(map(_job, rows[:limit]))
        more = len(rows) > limit and jobs
        return JobPage(jobs, f"{jobs[-1].created!r}/{jobs[-1].job_id}" if more else "")

    def latest_named(self, name: str) -> JobRecord | None:
        """The newest job of this name, or None."""
        rows = self._run(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE name = ? ORDER BY created DESC, job_id DESC LIMIT 1",
                         (name,))
        return _job(rows[0]) if rows else None

    def unfinished(self) -> list[JobRecord]:
        """Jobs to resume after a restart, oldest first."""
        rows = self._run(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE state IN (?, ?) ORDER BY created",
                         (JobState.QUEUED.value, JobState.RUNNING.value))
        return [_job(r) for r in rows]

    def attempts(self, job_id: str, limit: int = -1) -> list[AttemptOutcome]:
        rows = self._run(f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ? ORDER BY finished LIMIT ?",
                         (job_id, limit))
        return [AttemptOutcome(r[0], r[1], r[2], r[3], r[4], EpisodeStatus(r[5]), r[6], r[7], r[8], r[9], bool(r[10]),
                               **_from_details(r[11]), segments=int(r[12])) for r in rows]

    def tallies(self, job_id: str) -> list[TaskTally]:
        """Per-task counts of the job's finished attempts (infra errors counted apart, never scored)."""
        infra = EpisodeStatus.INFRA_ERROR.value
        rows = self._run(
            "SELECT task_id, SUM(status != ?), SUM(resolved * (status != ?)), TOTAL(reward * (status != ?)),"
            " SUM(status = ?) FROM attempts WHERE job_id = ? GROUP BY task_id ORDER BY task_id",
            (infra, infra, infra, infra, job_id))
        return [TaskTally(r[0], int(r[1]), int(r[2]), float(r[3]), int(r[4])) for r in rows]

    def finished_count(self, job_id: str) -> int:
        return int(self._run("SELECT COUNT(*) FROM attempts WHERE job_id = ?", (job_id,))[0][0])

    def finished_keys(self, job_id: str) -> set[tuple[str, int]]:
        rows = self._run("SELECT task_id, attempt FROM attempts WHERE job_id = ?", (job_id,))
        return {(r[0], int(r[1])) for r in rows}


def _state_filter(states: set[JobState] | None) -> tuple[list[str], list[object]]:
    if not states:
        return [], []
    return [f"state IN ({', '.join('?' * len(states))})"], [s.value for s in sorted(states)]


def _parse_token(token: str) -> tuple[float, str]:
    created, sep, job_id = token.partition("/")
    try:
        if not sep or not job_id:
            raise ValueError(token)
        return float(created), job_id
    except ValueError:
        raise ValueError(f"page_token: {token[:80]!r} is not a token this server returned") from None


def _details(o: AttemptOutcome) -> str:
    return json.dumps({"why": o.why, "failed_tests": [list(t) for t in o.failed_tests],
                       "verifier_output_tail": o.verifier_output_tail})


def _from_details(text: str) -> dict:
    d = json.loads(text or "{}")
    return {"why": str(d.get("why", "")), "failed_tests": tuple((str(n), str(m)) for n, m in d.get("failed_tests", ())),
            "verifier_output_tail": str(d.get("verifier_output_tail", ""))}


def _job(row: tuple) -> JobRecord:
    return JobRecord(row[0], row[1], JobState(row[2]), bytes(row[3]), tuple(json.loads(row[4])), int(row[5]),
                     float(row[6]), float(row[7]), row[8], int(row[9]), int(row[10]))
