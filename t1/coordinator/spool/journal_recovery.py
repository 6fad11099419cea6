"""What a restarted coordinator does with the journals of episodes its predecessor did not finish.

Every journal left in `<run_dir>/journal/` is an episode that was live when the coordinator died
(a finished one's file goes once its trajectory is spooled). `recover` sorts them at start-up:

- resumable: a training episode that finished its setup, journaled its sandbox's record, and
  whose provider's sandboxes outlive a coordinator (`resume`): kept as `Unfinished`, and the
  training stage continues it from its last turn in the reattached sandbox
  (`RolloutRunner.resume_episode`); one whose sandbox is gone by then ends as below;
- any other: ends as infra_error now. Its trajectory, rebuilt from the journal (every turn that
  completed, arrays as sampled), is spooled with reward 0 and status infra_error, so its group
  completes at the trainer and the episode is kept out of training and advantages, never scored;
- already in the spool (the coordinator died between spooling it and removing its journal): the
  journal goes, nothing else (the trainer deduplicates by id in any case).

A journal that does not replay (damaged past its first frames) is kept aside as
`<file>.corrupt`, named in the log and counted. An eval attempt's journal is removed: its job runs
the attempt again (it has no row in the job store).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from t1.agent.resume_point import NotResumable, resume_point
from t1.coordinator.spool.journal import Journal, read_events, read_frames
from t1.coordinator.spool.trajectory_spool import Spool
from t1.metrics import registry as m
from t1.sandbox.types import SandboxRecord
from t1.tito.buffer import build_segments
from t1.tito.replay import JournalMismatch, replay
from t1.trajectory.offload import offload
from t1.trajectory.serialization import encode_trajectory
from t1.trajectory.types import EpisodeStatus, Trajectory

log = logging.getLogger(__name__)
CORRUPT_SUFFIX = ".corrupt"
DAMAGED = (JournalMismatch, ValueError, KeyError, TypeError)


@dataclass(frozen=True, slots=True)
class Unfinished:
    """A training episode to continue from its journal in its sandbox (the record reattaches it)."""

    path: Path
    episode_id: str
    task_id: str
    group_id: str
    attempt: int
    record: SandboxRecord


@dataclass(frozen=True, slots=True)
class Recovered:
    """Episodes found unfinished in the journal and what became of them at start-up."""

    episodes: int = 0         # journals found
    resumable: int = 0        # left for the training stage to resume
    infra_errors: int = 0     # spooled as infra_error
    turns_lost: int = 0       # completed turns of those episodes (none of them is trained)
    damaged: int = 0          # journals that did not replay (set aside)
    already_spooled: int = 0  # their trajectory was in the spool: the journal only is removed
    unfinished: tuple[Unfinished, ...] = field(default=(), repr=False)

    def summary(self) -> dict[str, int]:
        """The counts (the run log's journal_recovered record, the report)."""
        return {"episodes": self.episodes, "resumable": self.resumable, "infra_errors": self.infra_errors,
                "turns_lost": self.turns_lost, "damaged": self.damaged, "already_spooled": self.already_spooled}


def unfinished_trajectory(path: Path) -> tuple[Trajectory | None, int]:
    """The infra_error trajectory of a training episode's journal (None for an eval attempt's, or one without its
    begin record) and its completed turns."""
    events, torn = read_events(path)
    if torn:
        log.info("journal %s: %d bytes after the last intact record (the turn in flight) are dropped", path, torn)
    if not events or events[0][0] != "begin" or not events[0][1].get("training", True):
        return None, 0
    begin = events[0][1]
    segments = build_segments(replay(events).builders)
    turns = sum(1 for kind, _ in events if kind == "turn")
    return Trajectory(id=str(begin["episode_id"]), task_id=str(begin["task_id"]), group_id=str(begin["group_id"]),
                      attempt=int(begin["attempt"]), segments=segments, reward=0.0,
                      status=EpisodeStatus.INFRA_ERROR), turns


def resumable(path: Path) -> Unfinished | None:
    """The journal's episode as one to resume, or None (not resumable: t1/agent/resume_point.py says why)."""
    try:
        point = resume_point(read_frames(path))
    except NotResumable as exc:
        log.info("journal %s: not resumable (%s)", path, exc)
        return None
    record = point.sandbox.get("record")
    if record is None:
        return None
    return Unfinished(path, point.episode_id, point.task_id, point.group_id, point.attempt,
                      SandboxRecord.from_json(record))


async def end_unfinished(journal: Journal, spool: Spool, path: Path, kind: str = "coordinator_restart") -> int | None:
    """Spool one unfinished episode's journal as infra_error (a training episode's) and remove the journal; the
    completed turns it loses (None for an eval attempt's: nothing spooled), -1 when the journal does not replay
    (set aside, counted)."""
    try:
        traj, turns = await offload(unfinished_trajectory, path)
    except DAMAGED as exc:
        m.INFRA_FAILURES.labels(kind="journal_damaged").inc()
        side = path.with_name(path.name + CORRUPT_SUFFIX)
        path.rename(side)
        log.error("journal %s does not replay (%s): kept as %s, the episode is lost", path, exc, side)
        return -1
    if traj is not None:
        await spool.append(traj.id, await offload(encode_trajectory, traj))
        m.INFRA_FAILURES.labels(kind=kind).inc()
    await journal.written(journal.submit(path, None))
    return turns if traj is not None else None


async def recover(journal: Journal, spool: Spool, resume: bool) -> Recovered:
    """Sort the journals a dead coordinator left (module docstring); with `resume` False none is resumable."""
    found = infra = lost = damaged = spooled = 0
    kept: list[Unfinished] = []
    for path in journal.files():
        found += 1
        try:
            unfinished = await offload(resumable, path) if resume else None
        except DAMAGED as exc:
            log.warning("journal %s: its resume point does not read (%s)", path, exc)
            unfinished = None
        if unfinished is not None and spool.record_of(unfinished.episode_id) is not None:
            spooled += 1
            await journal.written(journal.submit(path, None))
            continue
        if unfinished is not None:
            kept.append(unfinished)
            continue
        turns = await end_unfinished(journal, spool, path)
        if turns is not None and turns < 0:
            damaged += 1
        elif turns is not None:
            infra, lost = infra + 1, lost + turns
    if found:
        log.warning("journal: %d episodes the previous coordinator left unfinished: %d to resume, %d end as "
                    "infra_error (%d completed turns not trained), %d damaged, %d already spooled",
                    found, len(kept), infra, lost, damaged, spooled)
    return Recovered(found, len(kept), infra, lost, damaged, spooled, tuple(kept))
