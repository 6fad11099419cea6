"""Helpers of the chaos tests: seeded kill points, the processes a run left behind, and a run's ledgers."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path


def kill_points(seed: int, count: int, low: int, high: int) -> list[int]:
    """`count` seeded points in [low, high] (e.g. finished attempts after which to kill)."""
    rng = random.Random(seed)
    return sorted(rng.randint(low, high) for _ in range(count))


def processes_under(root: Path) -> list[tuple[int, str]]:
    """Live processes (not zombies) whose command line or working directory mentions root."""
    found = []
    needle = str(root).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().split(") ", 1)[-1][:1]
            cwd = os.readlink(entry / "cwd").encode()
        except (OSError, ValueError):
            continue
        if state != "Z" and (needle in cmdline or cwd.startswith(needle)):
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]))
    return found


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)


def finished_attempts(db: Path, job_id: str) -> set[tuple[str, int]]:
    if not db.exists():
        return set()
    with sqlite3.connect(db) as con:
        return {(r[0], int(r[1])) for r in con.execute("SELECT task_id, attempt FROM attempts WHERE job_id = ?",
                                                      (job_id,))}


def trained_steps(buffer: Path) -> list[tuple[int, list[str]]]:
    with sqlite3.connect(buffer) as con:
        return [(int(s), json.loads(ids)) for s, ids in con.execute("SELECT step, trajectory_ids FROM steps ORDER BY "
                                                                    "step")]


def accepted_ids(buffer: Path) -> set[str]:
    with sqlite3.connect(buffer) as con:
        return {str(r[0]) for r in con.execute("SELECT id FROM trajectories")}
