"""The eval job store: jobs and every finished attempt in SQLite, so a restarted coordinator resumes.

An attempt row is written (and committed with synchronous=FULL) the moment the attempt
finishes; the primary key (job, task, attempt) makes a second write of the same attempt a
no-op, and a resumed job runs only the attempts that have no row.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from t1.coordinator.results import AttemptOutcome
from t1.trajectory.types import EpisodeStatus

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
    error TEXT NOT NULL DEFAULT ''
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
    PRIMARY KEY (job_id, task_id, attempt)
);
"""


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

    @property
    def total_attempts(self) -> int:
        return len(self.task_ids) * self.attempts_per_task


class JobStore:
    """One SQLite file; every method is a short transaction (safe to call from the event loop)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(attempts)")}
        if "details" not in columns:  # a store written before attempts said why
            self._db.execute("ALTER TABLE attempts ADD COLUMN details TEXT NOT NULL DEFAULT '{}'")

    def close(self) -> None:
        self._db.close()

    def create_job(self, name: str, request: bytes, task_ids: list[str], attempts_per_task: int) -> JobRecord:
        now = time.time()
        job_id = f"job-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{uuid.uuid4().hex[:6]}"
        rec = JobRecord(job_id, name or job_id, JobState.QUEUED, request, tuple(task_ids), attempts_per_task, now, now)
        with self._db:
            self._db.execute(
                "INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (rec.job_id, rec.name, rec.state.value, rec.request, json.dumps(list(rec.task_ids)),
                 rec.attempts_per_task, rec.created, rec.updated, ""),
            )
        return rec

    def set_state(self, job_id: str, state: JobState, error: str = "") -> None:
        with self._db:
            self._db.execute("UPDATE jobs SET state = ?, error = ?, updated = ? WHERE job_id = ?",
                             (state.value, error, time.time(), job_id))

    def record_attempt(self, job_id: str, o: AttemptOutcome) -> bool:
        """Store a finished attempt; False when it was already stored (never overwritten)."""
        with self._db:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, o.task_id, o.attempt, o.reward, o.passed, o.total, o.status.value, o.turns, o.tokens,
                 o.duration_s, o.failure_mode, int(o.resolved), time.time(), _details(o)),
            )
            self._db.execute("UPDATE jobs SET updated = ? WHERE job_id = ?", (time.time(), job_id))
        return cur.rowcount == 1

    def get(self, job_id: str) -> JobRecord | None:
        row = self._db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return _job(row) if row else None

    def list_jobs(self, states: set[JobState] | None = None, limit: int = 0) -> list[JobRecord]:
        rows = self._db.execute("SELECT * FROM jobs ORDER BY created DESC").fetchall()
        jobs = [j for j in map(_job, rows) if not states or j.state in states]
        return jobs[:limit] if limit > 0 else jobs

    def unfinished(self) -> list[JobRecord]:
        """Jobs to resume after a restart, oldest first."""
        return sorted(self.list_jobs({JobState.QUEUED, JobState.RUNNING}), key=lambda j: j.created)

    def attempts(self, job_id: str) -> list[AttemptOutcome]:
        rows = self._db.execute(
            "SELECT task_id, attempt, reward, passed, total, status, turns, tokens, duration_s, failure_mode, resolved,"
            " details FROM attempts WHERE job_id = ? ORDER BY finished", (job_id,)).fetchall()
        return [AttemptOutcome(r[0], r[1], r[2], r[3], r[4], EpisodeStatus(r[5]), r[6], r[7], r[8], r[9], bool(r[10]),
                               **_from_details(r[11])) for r in rows]

    def finished_keys(self, job_id: str) -> set[tuple[str, int]]:
        rows = self._db.execute("SELECT task_id, attempt FROM attempts WHERE job_id = ?", (job_id,)).fetchall()
        return {(r[0], int(r[1])) for r in rows}


def _details(o: AttemptOutcome) -> str:
    return json.dumps({"why": o.why, "failed_tests": [list(t) for t in o.failed_tests],
                       "verifier_output_tail": o.verifier_output_tail})


def _from_details(text: str) -> dict:
    d = json.loads(text or "{}")
    return {"why": str(d.get("why", "")), "failed_tests": tuple((str(n), str(m)) for n, m in d.get("failed_tests", ())),
            "verifier_output_tail": str(d.get("verifier_output_tail", ""))}


def _job(row: tuple) -> JobRecord:
    return JobRecord(row[0], row[1], JobState(row[2]), bytes(row[3]), tuple(json.loads(row[4])), int(row[5]),
                     float(row[6]), float(row[7]), row[8])
