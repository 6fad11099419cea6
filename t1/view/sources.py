"""Read-only readers of what a run leaves on disk: the run log, the spool, the trainer buffer, eval jobs, demos.

Nothing here writes, locks or repairs: SQLite files are opened `mode=ro`, spool files are read
frame by frame (a torn tail of a file still being written is simply not read yet), and every
reader can start where the last one stopped, so a live run is followed by reading only what is new.
Record formats are the writers' own: `t1.trajectory.spool_files` frames, `t1.trainer.buffer`
tables, `t1.coordinator.evals.job_store` tables, `t1.trajectory.serialization` records.
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from t1.evals.results import AttemptOutcome
from t1.trainer.buffer import StepRecord
from t1.trajectory import spool_files as sf
from t1.trajectory.serialization import decode_trajectory
from t1.trajectory.types import EpisodeStatus, Trajectory

RUN_LOG = "run.jsonl"
SPOOL_DIR = "spool"
JOBS_DB = "jobs.db"
DEMOS = "demos.msgpack"
TRANSCRIPTS = "transcripts"
BUFFER_DB = "buffer.sqlite"


@dataclass(frozen=True, slots=True)
class Locator:
    """Where one trajectory record's bytes are: a file slice (spool frame, demos record) or a buffer row."""

    path: Path
    offset: int = 0
    length: int = 0
    row_id: str = ""  # trainer buffer: the trajectory id; then offset/length are unused


def read_locator(loc: Locator) -> Trajectory:
    """The trajectory a locator points at, decoded (arrays are views on the bytes read)."""
    if loc.row_id:
        with connect_ro(loc.path) as db:
            row = db.execute("SELECT payload FROM trajectories WHERE id = ?", (loc.row_id,)).fetchone()
        if row is None:
            raise KeyError(f"{loc.path}: no trajectory {loc.row_id!r}")
        return decode_trajectory(bytes(row[0]))
    with loc.path.open("rb") as f:
        f.seek(loc.offset)
        data = f.read(loc.length)
    if loc.path.suffix == sf.SEGMENT_SUFFIX:
        _, data = sf.decode_record(data, loc.path)
    return decode_trajectory(data)


def connect_ro(path: Path) -> sqlite3.Connection:
    """A read-only connection; the writer keeps WAL mode, readers never block it."""
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0, check_same_thread=False)


def read_jsonl_from(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete lines of a JSONL file from byte `offset`; returns them and the offset after the last one."""
    if not path.is_file():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1  # a line still being written is read next time
    records = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return records, offset + end


def spool_frames_from(path: Path, offset: int) -> tuple[list[tuple[str, Locator]], int]:
    """(trajectory id, locator) of each intact spool frame from `offset`, and where reading stopped."""
    out: list[tuple[str, Locator]] = []
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    pos = 0
    head = sf.HEADER
    while pos + head.size <= len(data):
        length, crc = head.unpack_from(data, pos)
        end = pos + head.size + length
        if end > len(data):
            break
        body = data[pos + head.size:end]
        if zlib.crc32(body) != crc:  # a frame being written (or a damaged one): not read
            break
        tid, _ = sf.decode_record(body, path)
        # the locator covers the body (msgpack [id, payload]); read_locator unwraps it
        out.append((tid, Locator(path, offset + pos + head.size, length)))
        pos = end
    return out, offset + pos


def spool_files(run_dir: Path) -> list[Path]:
    directory = run_dir / SPOOL_DIR
    return [sf.segment_path(directory, i) for i in sf.list_segments(directory)] if directory.is_dir() else []


def demo_records(path: Path) -> Iterator[tuple[Trajectory, Locator]]:
    """Trajectories of a demos file (concatenated codec records), with the slice each one occupies."""
    with path.open("rb") as f:
        data = f.read()
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    start = 0
    for _ in unpacker:
        end = unpacker.tell()
        loc = Locator(path, start, end - start)
        yield decode_trajectory(data[start:end]), loc
        start = end


@dataclass(frozen=True, slots=True)
class BufferRow:
    seq: int
    id: str
    group_id: str
    received: float
    consumed_step: int | None
    payload: bytes


def buffer_rows_after(db_path: Path, seq: int) -> Iterator[BufferRow]:
    """Trainer buffer rows with seq > `seq`, oldest first, streamed (a buffer holds GBs of records)."""
    with connect_ro(db_path) as db:
        cur = db.execute("SELECT seq, id, group_id, received, consumed_step, payload FROM trajectories "
                         "WHERE seq > ? ORDER BY seq", (seq,))
        while chunk := cur.fetchmany(64):
            for s, i, g, r, c, p in chunk:
                yield BufferRow(int(s), i, g, float(r), c, bytes(p))


def buffer_step_count(db_path: Path) -> int:
    with connect_ro(db_path) as db:
        return int(db.execute("SELECT COUNT(*) FROM steps").fetchone()[0])


def buffer_consumed(db_path: Path) -> dict[str, int]:
    """Trajectory id -> the step that trained on it."""
    with connect_ro(db_path) as db:
        return dict(db.execute("SELECT id, consumed_step FROM trajectories WHERE consumed_step IS NOT NULL"))


def buffer_steps(db_path: Path) -> list[StepRecord]:
    """The trainer's committed steps, in order (metrics may hold NaN: json reads it as float nan)."""
    with connect_ro(db_path) as db:
        rows = db.execute("SELECT step, kind, policy_version, trajectory_ids, metrics FROM steps "
                          "ORDER BY step").fetchall()
    return [StepRecord(int(s), k, int(v), tuple(json.loads(ids)), json.loads(mx)) for s, k, v, ids, mx in rows]


@dataclass(frozen=True, slots=True)
class JobRow:
    job_id: str
    name: str
    state: str
    attempts_per_task: int
    num_tasks: int
    created: float


def eval_jobs(db_path: Path) -> list[tuple[JobRow, list[tuple[AttemptOutcome, float]]]]:
    """Every eval job, oldest first, with its finished attempts and when each finished."""
    with connect_ro(db_path) as db:
        jobs = db.execute("SELECT job_id, name, state, attempts_per_task, task_ids, created FROM jobs "
                          "ORDER BY created").fetchall()
        attempts = db.execute("SELECT job_id, task_id, attempt, reward, passed, total, status, turns, tokens, "
                              "duration_s, failure_mode, resolved, finished FROM attempts "
                              "ORDER BY finished").fetchall()
    by_job: dict[str, list[tuple[AttemptOutcome, float]]] = {}
    for job_id, task, attempt, reward, passed, total, status, turns, tokens, dur, mode, resolved, fin in attempts:
        outcome = AttemptOutcome(task_id=task, attempt=int(attempt), reward=float(reward), passed=int(passed),
                                 total=int(total), status=EpisodeStatus(status), turns=int(turns),
                                 tokens=int(tokens), duration_s=float(dur), failure_mode=mode,
                                 resolved=bool(resolved))
        by_job.setdefault(job_id, []).append((outcome, float(fin)))
    return [(JobRow(j, n, s, int(a), len(json.loads(ids)), float(c)), by_job.get(j, []))
            for j, n, s, a, ids, c in jobs]
