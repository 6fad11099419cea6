"""What a restarted coordinator does with the journals of episodes its predecessor did not finish.

Every journal left in `<run_dir>/journal/` is an episode that was live when the coordinator died
(a finished one's file goes once its trajectory is spooled). Its sandbox is not continued here,
so the episode ends as infra_error: its trajectory, rebuilt from the journal (every turn that
completed, arrays as sampled), is spooled with reward 0 and status infra_error, so its group
completes at the trainer and the episode is kept out of training and advantages, never scored.
The trainer deduplicates by id, so a journal whose trajectory was spooled just before the crash
costs nothing. A journal that does not replay (damaged past its first frames) is kept aside as
`<file>.corrupt`, named in the log and counted. An eval attempt's journal is removed: its job runs
the attempt again (it has no row in the job store).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from t1.coordinator.journal import Journal, read_events
from t1.coordinator.spool import Spool
from t1.metrics import registry as m
from t1.tito.buffer import build_segments
from t1.tito.replay import JournalMismatch, replay
from t1.trajectory.offload import offload
from t1.trajectory.serialization import encode_trajectory
from t1.trajectory.types import EpisodeStatus, Trajectory

log = logging.getLogger(__name__)
CORRUPT_SUFFIX = ".corrupt"


@dataclass(frozen=True, slots=True)
class Recovered:
    """Episodes found unfinished in the journal and how they ended."""

    episodes: int = 0       # journals found
    infra_errors: int = 0   # spooled as infra_error
    turns_lost: int = 0     # completed turns of those episodes (none of them is trained)
    damaged: int = 0        # journals that did not replay (set aside)


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


async def end_unfinished(journal: Journal, spool: Spool) -> Recovered:
    """Spool every unfinished episode of the journal as infra_error, then remove its journal."""
    found = infra = lost = damaged = 0
    for path in journal.files():
        found += 1
        try:
            traj, turns = await offload(unfinished_trajectory, path)
        except (JournalMismatch, ValueError, KeyError, TypeError) as exc:
            damaged += 1
            m.INFRA_FAILURES.labels(kind="journal_damaged").inc()
            side = path.with_name(path.name + CORRUPT_SUFFIX)
            path.rename(side)
            log.error("journal %s does not replay (%s): kept as %s, the episode is lost", path, exc, side)
            continue
        if traj is not None:
            await spool.append(traj.id, await offload(encode_trajectory, traj))
            infra += 1
            lost += turns
            m.INFRA_FAILURES.labels(kind="coordinator_restart").inc()
        await journal.written(journal.submit(path, None))
    if found:
        log.warning("journal: %d episodes the previous coordinator left unfinished end as infra_error "
                    "(%d completed turns not trained; %d journals damaged)", infra, lost, damaged)
    return Recovered(found, infra, lost, damaged)
