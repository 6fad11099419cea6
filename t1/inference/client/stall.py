"""Stall watch: a replica that answers GetModelInfo but completes no tokens while it has requests.

A health check that answers says nothing about generation (a server can report healthy at zero
throughput). The pool asks each busy replica (requests of its own outstanding there, or a weight
load of its own running) for its progress every `check_s`: a replica whose `completed_tokens` and
`model_steps` (a long prefill is progress) have not moved for `stall_s` while it reports running requests, one that has
not answered a probe for
that long while busy, or one whose weight load has run longer than `weights_stall_s`, is stalled.
The pool then avoids it, fails its in-flight requests over to other replicas and logs the verdict
with what the server reported (`Stall`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from t1.v1 import inference_pb2 as pb


class StallKind(StrEnum):
    NO_TOKENS = "no_tokens"          # requests running, no token completed
    NO_ANSWER = "no_answer"          # busy, and the probes went unanswered
    WEIGHTS_LOAD = "weights_load"    # a weight load that does not finish


@dataclass(frozen=True, slots=True)
class Stall:
    """One verdict: which replica, why, for how long, and the last progress it reported."""

    address: str
    kind: StallKind
    quiet_s: float                 # how long it went without progress
    active_requests: int           # as last reported (-1: never answered)
    completed_tokens: int
    weights_loading_s: float

    def describe(self) -> str:
        reported = ("it never answered a probe" if self.active_requests < 0 else
                    f"it reported {self.active_requests} requests running, {self.completed_tokens} tokens "
                    f"completed since start, weight load running for {self.weights_loading_s:.1f} s")
        return f"{self.address} stalled ({self.kind}) for {self.quiet_s:.1f} s: {reported}"


@dataclass(slots=True)
class _Progress:
    since: float                  # when the replica last made progress (or became busy)
    completed: tuple[int, int] = (-1, -1)  # (completed_tokens, model_steps) at that time
    last: pb.ModelInfo | None = None


class StallWatch:
    """Per-replica progress; `observe` is fed each probe's answer (None: no answer) and returns a verdict."""

    def __init__(self, stall_s: float, weights_stall_s: float) -> None:
        self.stall_s, self.weights_stall_s = stall_s, weights_stall_s
        self._progress: dict[str, _Progress] = {}

    def idle(self, address: str) -> None:
        """The replica has nothing of ours in flight: its clock starts again when it is busy."""
        self._progress.pop(address, None)

    def observe(self, address: str, info: pb.ModelInfo | None, now: float) -> Stall | None:
        p = self._progress.get(address)
        if p is None:
            p = self._progress[address] = _Progress(since=now)
        if info is not None:
            p.last = info
            if info.weights_loading_s > self.weights_stall_s:
                return self._verdict(address, StallKind.WEIGHTS_LOAD, info.weights_loading_s, info)
            progress = (int(info.completed_tokens), int(info.model_steps))
            if info.active_requests == 0 or progress != p.completed:
                p.since, p.completed = now, progress
                return None
        quiet = now - p.since
        if quiet < self.stall_s:
            return None
        return self._verdict(address, StallKind.NO_TOKENS if info is not None else StallKind.NO_ANSWER, quiet, p.last)

    def _verdict(self, address: str, kind: StallKind, quiet: float, info: pb.ModelInfo | None) -> Stall:
        self._progress.pop(address, None)
        if info is None:
            return Stall(address, kind, quiet, -1, -1, 0.0)
        return Stall(address, kind, quiet, int(info.active_requests), int(info.completed_tokens),
                     float(info.weights_loading_s))
