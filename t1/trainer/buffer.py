"""The trainer's durable trajectory buffer: SQLite in WAL mode with synchronous=FULL.

A trajectory is acknowledged only after `add` returns, i.e. after its row is committed and
fsynced. A trajectory moves from pending to consumed only in the same transaction that records
the step (and checkpoint) that trained on it, so after a crash the trainer retrains exactly the
trajectories of steps that were not committed and never one that was.

A group whose step failed (an error no accept-time check caught) is quarantined: its id and the
reason go to the `quarantine` table, and `complete_groups` never offers it again, so one bad
record cannot turn into a crash loop. Its rows stay, for an operator to read (docs/operations.md).
A database SQLite cannot read raises StorageError naming the file.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t1.workdir import StorageError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS trajectories (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    group_id TEXT NOT NULL,
    payload BLOB NOT NULL,
    received REAL NOT NULL,
    consumed_step INTEGER
);
CREATE INDEX IF NOT EXISTS pending_groups ON trajectories (group_id) WHERE consumed_step IS NULL;
CREATE TABLE IF NOT EXISTS steps (
    step INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    policy_version INTEGER NOT NULL,
    trajectory_ids TEXT NOT NULL,
    metrics TEXT NOT NULL,
    finished REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS quarantine (
    group_id TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    at_step INTEGER NOT NULL,
    quarantined REAL NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A group set aside after a step on it failed, and why."""

    group_id: str
    reason: str
    at_step: int
    trajectory_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A committed step: what it trained on and what it measured."""

    step: int
    kind: str
    policy_version: int
    trajectory_ids: tuple[str, ...]
    metrics: Mapping[str, float]
    group_ids: tuple[str, ...] = ()


class TrajectoryBuffer:
    """Thread-safe; every public method is one transaction."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise StorageError(f"trainer buffer {path}: {exc} (it holds every acknowledged trajectory: restore it "
                               "from a backup, or move it aside to start the run over)") from None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, trajectory_id: str, group_id: str, payload: bytes) -> bool:
        """Store durably; False when the id is already known (pending or trained)."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO trajectories (id, group_id, payload, received) VALUES (?, ?, ?, ?)",
                (trajectory_id, group_id, payload, time.time()),
            )
            return cur.rowcount == 1

    def complete_groups(self, group_size: int, limit: int,
                        skip: Collection[str] = ()) -> list[tuple[str, list[tuple[str, bytes]]]]:
        """Up to `limit` pending groups with at least group_size members, oldest first, except `skip`
        (groups already taken by steps that are not committed yet)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT group_id FROM trajectories WHERE consumed_step IS NULL "
                "AND group_id NOT IN (SELECT group_id FROM quarantine) GROUP BY group_id "
                "HAVING COUNT(*) >= ? ORDER BY MIN(seq) LIMIT ?", (group_size, limit + len(skip)),
            ).fetchall()
            groups = []
            for (group_id,) in [r for r in rows if r[0] not in skip][:limit]:
                members = self._db.execute(
                    "SELECT id, payload FROM trajectories WHERE group_id = ? AND consumed_step IS NULL ORDER BY seq",
                    (group_id,),
                ).fetchall()
                groups.append((group_id, [(str(i), bytes(p)) for i, p in members]))
            return groups

    def commit_steps(self, records: Sequence[StepRecord], meta: Mapping[str, Any]) -> None:
        """Mark the steps' trajectories consumed and store the steps and meta, atomically."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for record in records:
                    self._db.execute(
                        "INSERT INTO steps (step, kind, policy_version, trajectory_ids, metrics, finished) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        (record.step, record.kind, record.policy_version, json.dumps(list(record.trajectory_ids)),
                         json.dumps(dict(record.metrics)), time.time()),
                    )
                    self._db.executemany(
                        "UPDATE trajectories SET consumed_step = ? WHERE id = ? AND consumed_step IS NULL",
                        [(record.step, tid) for tid in record.trajectory_ids],
                    )
                self._set_meta(meta)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def quarantine(self, group_ids: Iterable[str], reason: str, at_step: int) -> None:
        """Set groups aside for good (their pending rows are kept, never offered to a step again)."""
        with self._lock:
            self._db.executemany(
                "INSERT OR IGNORE INTO quarantine (group_id, reason, at_step, quarantined) VALUES (?, ?, ?, ?)",
                [(g, reason[:4000], at_step, time.time()) for g in group_ids])

    def payload(self, trajectory_id: str) -> bytes | None:
        """The record of one trajectory exactly as it was accepted, or None."""
        with self._lock:
            row = self._db.execute("SELECT payload FROM trajectories WHERE id = ?", (trajectory_id,)).fetchone()
        return bytes(row[0]) if row else None

    def quarantined(self) -> list[Quarantined]:
        with self._lock:
            rows = self._db.execute("SELECT group_id, reason, at_step FROM quarantine ORDER BY quarantined").fetchall()
            out = []
            for group_id, reason, at_step in rows:
                ids = self._db.execute("SELECT id FROM trajectories WHERE group_id = ? ORDER BY seq",
                                       (group_id,)).fetchall()
                out.append(Quarantined(group_id, reason, int(at_step), tuple(str(i) for (i,) in ids)))
            return out

    def _set_meta(self, meta: Mapping[str, Any]) -> None:
        self._db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                             [(k, json.dumps(v)) for k, v in meta.items()])

    def meta(self) -> dict[str, Any]:
        with self._lock:
            return {k: json.loads(v) for k, v in self._db.execute("SELECT key, value FROM meta")}

    def steps(self) -> list[StepRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT step, kind, policy_version, trajectory_ids, metrics FROM steps ORDER BY step").fetchall()
        return [StepRecord(s, k, v, tuple(json.loads(ids)), json.loads(m)) for s, k, v, ids, m in rows]

    def counts(self, group_size: int) -> dict[str, int]:
        """accepted (ever), pending trajectories and complete groups (quarantined ones apart), quarantined groups."""
        with self._lock:
            accepted = self._db.execute("SELECT COUNT(*) FROM trajectories").fetchone()[0]
            pending = self._db.execute(
                "SELECT COUNT(*) FROM trajectories WHERE consumed_step IS NULL "
                "AND group_id NOT IN (SELECT group_id FROM quarantine)").fetchone()[0]
            groups = self._db.execute(
                "SELECT COUNT(*) FROM (SELECT group_id FROM trajectories WHERE consumed_step IS NULL "
                "AND group_id NOT IN (SELECT group_id FROM quarantine) "
                "GROUP BY group_id HAVING COUNT(*) >= ?)", (group_size,)).fetchone()[0]
            quarantined = self._db.execute("SELECT COUNT(*) FROM quarantine").fetchone()[0]
        return {"accepted": int(accepted), "pending": int(pending), "groups": int(groups),
                "quarantined": int(quarantined)}

    def last_quarantine_reason(self) -> str:
        with self._lock:
            row = self._db.execute("SELECT reason FROM quarantine ORDER BY quarantined DESC LIMIT 1").fetchone()
        return str(row[0]) if row else ""
