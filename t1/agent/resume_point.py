"""Where an unfinished episode's journal lets it continue: the state after its last completed turn.

A journal (t1/coordinator/spool/journal.py) holds, in order, the episode's begin, its sandbox record,
`ready` (provisioned: how shells start, the verifier baseline), then per turn the buffer's records
(segment, gen, ctx) and a `turn` record. The resume point is the end of the last `turn` record
(or of `ready` when no turn completed): what follows it is the turn that was in flight when the
coordinator died (a generation whose commands may have run, a compaction, an observation), cut
off and played again. Pure: events in, a ResumePoint or the reason there is none out.

Not resumable (the episode ends as infra_error): no sandbox record or no `ready` (it died during
setup), an eval attempt's journal, a multi-step task past its first step (the earlier steps'
verifier reports are not journaled).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t1.agent.shell_state import ShellState
from t1.errors import DataError
from t1.tasks.image.dockerplan import ReplayStep
from t1.tasks.provision import Provisioned

Event = tuple[str, dict[str, Any]]
BUFFER_KINDS = frozenset({"segment", "gen", "ctx"})


class NotResumable(DataError, ValueError):
    """The journal has no point to continue from (named why)."""


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """The episode's state after its last completed turn, and the buffer records up to it."""

    episode_id: str
    task_id: str
    group_id: str
    attempt: int
    agent_format: str
    sandbox: Mapping[str, Any]            # the SandboxRecord's fields (provider, sandbox_id, data)
    provisioned: Provisioned
    baseline: int
    keep_bytes: int                       # the journal up to here stays; the rest is the turn in flight
    buffer_events: tuple[Event, ...]      # segment/gen/ctx records to rebuild the TokenBuffer from
    tito: Mapping[str, Any]               # the buffer's resume_state() at the resume point
    turns: int = 0
    segments: int = 1
    phase: int = 0
    checkpoints: Mapping[int, int] = dataclasses.field(default_factory=dict)
    bad_turns: tuple[int, ...] = ()
    bad_in_a_row: int = 0
    commands: tuple[tuple[str, int | None], ...] = ()
    pending_obs: tuple[Mapping[str, Any], ...] = ()
    done: bool = False                    # the last turn ended the episode: only the verifiers are left
    elapsed_s: float = 0.0                # episode wall time used at the resume point
    shell: ShellState | None = None
    resumes: int = 0                      # earlier resumes of this episode
    turn_lost: bool = False               # records of a turn in flight were cut off


def provisioned_record(p: Provisioned) -> dict[str, Any]:
    return {"workdir": p.workdir, "env": [list(kv) for kv in p.env], "user": p.user,
            "tests_files": [dataclasses.asdict(step) for step in p.tests_files],
            "build_context": None if p.build_context is None else str(p.build_context)}


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list | tuple) else value


def provisioned_from(record: Mapping[str, Any]) -> Provisioned:
    return Provisioned(str(record["workdir"]), _tuples(record["env"]), record["user"],
                       tuple(ReplayStep(**{k: _tuples(v) for k, v in step.items()}) for step in record["tests_files"]),
                       None if record["build_context"] is None else Path(record["build_context"]))


def resume_point(frames: Sequence[tuple[Event, int]]) -> ResumePoint:
    """The resume point of a journal's intact frames (each with the offset after it); NotResumable names why."""
    if not frames or frames[0][0][0] != "begin":
        raise NotResumable("the journal has no begin record")
    begin = frames[0][0][1]
    if not begin.get("training", True):
        raise NotResumable("an eval attempt (its job runs it again)")
    sandbox: Mapping[str, Any] | None = None
    ready_at = -1
    for i, ((kind, f), _) in enumerate(frames):
        if kind == "sandbox":
            sandbox, ready_at = f, -1  # a setup retry on a fresh sandbox: provisioned again
        elif kind == "ready":
            ready_at = i
    if sandbox is None or ready_at < 0:
        raise NotResumable("the episode had not finished its setup")
    turns = [i for i, ((kind, _), _) in enumerate(frames) if kind == "turn" and i > ready_at]
    last = turns[-1] if turns else ready_at
    ready = frames[ready_at][0][1]
    point = ResumePoint(
        episode_id=str(begin["episode_id"]), task_id=str(begin["task_id"]), group_id=str(begin["group_id"]),
        attempt=int(begin["attempt"]), agent_format=str(begin["agent_format"]), sandbox=sandbox,
        provisioned=provisioned_from(ready["provisioned"]), baseline=int(ready["baseline"]),
        keep_bytes=frames[last][1],
        buffer_events=tuple(e for e, _ in frames[:last + 1] if e[0] in BUFFER_KINDS),
        tito=ready["tito"], resumes=sum(1 for (kind, _), _ in frames if kind == "resumed"),
        turn_lost=any(kind == "gen" for (kind, _), _ in frames[last + 1:]))
    if not turns:
        return point
    records = [frames[i][0][1] for i in turns]
    t = records[-1]
    if int(t.get("phase", 0)) > 0:
        raise NotResumable("a multi-step task past its first step")
    shell = None
    for r in records:
        shell = ShellState.from_record(r.get("shell")) or shell
    bad_turns = tuple(int(r["turn"]) for r in records if r["bad"])
    in_a_row = 0
    for r in reversed(records):
        if not r["bad"]:
            break
        in_a_row += 1
    return dataclasses.replace(
        point, tito=t["tito"], turns=int(t["turn"]) + 1, phase=int(t.get("phase", 0)),
        segments=sum(1 for kind, _ in point.buffer_events if kind == "segment"),
        checkpoints={int(r["turn"]): int(r["checkpoint"]) for r in records if r["checkpoint"] is not None},
        bad_turns=bad_turns, bad_in_a_row=in_a_row,
        commands=tuple((str(c), None if x is None else int(x)) for r in records for c, x in r["commands"]),
        pending_obs=tuple(t["observation"]), done=bool(t["done"]), elapsed_s=float(t["elapsed"]), shell=shell)
