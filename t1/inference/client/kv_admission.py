"""Admission by KV headroom: an episode starts only where the replica has room for what it will grow to.

Each replica reports its KV capacity in tokens (GetModelInfo.kv_capacity_tokens; 0: no bound). The
pool keeps a ledger per replica: the positions each bound session holds there (its context after its
last turn; for a turn in flight, its prompt and max_tokens). A session *reserves* the larger of what
it holds and the expected peak context of an episode. A new session (an episode's first turn, or a
session moving to another replica) is admitted on a replica only when the reservations there plus its
own fit in the capacity; otherwise it waits until a session ends (`end_session`) or a turn ends there.
Episodes are thus admitted by headroom, and the rollout's `max_concurrent_episodes` stays an upper
bound on top.

The expected peak is learned: the mean final context of ended episodes, taken in the order they were
admitted (an episode counts only once every episode admitted before it has ended, so the short ones,
which end first, do not bias it low), over about the last `WINDOW` of them, with the prior counted as
`PRIOR_WEIGHT` episodes more (a few short episodes that happen to be admitted first do not open the
gate to a crowd that then outgrows the cache). The prior is `kv_expected_context_tokens` where set,
else the model's context limit capped at the capacity (one episode at a time per replica at first).

A resident session's turn always starts on its replica, whatever its context has grown to: its prefix
is cached there, and holding it back would only let the server's cache LRU drop that prefix while it
waits (at bench/kv_admission.py's small setting, resident turns held back for room cost 20-53% of
the turn rate: 3.90 against 4.89 turns/s with a 3,000-token expected peak, 1.99 against 4.26 with 2,000). Preemption
rule (the one way a resident session's cache is given up): when sessions
outgrow their reservations and the server runs out of KV, its cache LRU drops the least recently used
idle session's cache; that session's next turn is prefilled again, whole, with its routes
(t1.routing.concat: the later block wins). No turn is ever evicted mid-generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from t1.inference.client.affinity import Replica

RECHECK_S = 0.5  # a waiting session looks again this often (a replica's health changes without a notice)
WINDOW = 100  # the expected peak is a running mean over about this many ended episodes
PRIOR_WEIGHT = 4  # the prior counts as this many ended episodes
MAX_TRACKED = 100_000  # sessions followed for the expected peak (one never ended stops being waited for)


@dataclass(slots=True)
class _Ledger:
    capacity: int | None = None                         # None: not asked yet; 0: no bound
    max_context: int = 0                                # the model's context limit there (0: not known)
    held: dict[str, int] = field(default_factory=dict)  # session -> positions

    @property
    def used(self) -> int:
        return sum(self.held.values())


class KvAdmission:
    """The per-replica ledgers, the learned expected peak, and the wait for room."""

    def __init__(self, replicas: int, expected_context: int = 0) -> None:
        self.prior = expected_context  # the expected peak before any episode has ended (0: the context limit)
        self._ledgers = [_Ledger() for _ in range(replicas)]
        self._changed: asyncio.Event | None = None  # set (and replaced) when room may have freed
        self._admitted: dict[str, int | None] = {}  # admission order: session -> final context (None: running)
        self._context: dict[str, int] = {}  # session -> its context after its last turn
        self._peak = 0.0
        self._peaks = 0

    def known(self, idx: int) -> bool:
        return self._ledgers[idx].capacity is not None

    def set_capacity(self, idx: int, tokens: int, max_context: int = 0) -> None:
        ledger = self._ledgers[idx]
        ledger.capacity, ledger.max_context = max(0, tokens), max(0, max_context)

    def usage(self, idx: int) -> tuple[int, int]:
        """(capacity, used) of one replica's ledger, in tokens (capacity 0: no bound or not known)."""
        ledger = self._ledgers[idx]
        return ledger.capacity or 0, ledger.used

    def expected_peak(self, idx: int) -> int:
        """The context an episode admitted on replica `idx` is expected to grow to: the mean of the ended
        episodes' final contexts with the prior counted as PRIOR_WEIGHT more (a few short episodes that
        happened to end first do not open the gate to a crowd)."""
        ledger = self._ledgers[idx]
        prior = self.prior or min((x for x in (ledger.max_context, ledger.capacity) if x), default=0)
        seen = min(self._peaks, WINDOW)  # the running mean weighs about the last WINDOW of them
        return round((PRIOR_WEIGHT * prior + seen * self._peak) / (PRIOR_WEIGHT + seen))

    def fits(self, idx: int, session_id: str, need: int) -> bool:
        """Whether a turn needing `need` positions may start on replica `idx` now (see the module docstring)."""
        ledger = self._ledgers[idx]
        if not ledger.capacity or session_id in ledger.held or not ledger.held:
            return True  # no bound; a resident session; alone there (nothing else could make room)
        peak = self.expected_peak(idx)
        reserved = sum(max(tokens, peak) for s, tokens in ledger.held.items())
        return reserved + max(need, peak) <= ledger.capacity

    async def admit(self, session_id: str, need: int, pick: Callable[[], int],
                    replicas: Sequence[Replica]) -> tuple[int, float]:
        """Wait until a replica may start the turn, hold `need` there; returns the replica and how long the
        turn waited. `pick()`: the replica the pool would choose without KV admission (the session's own,
        else the least loaded); others are tried healthy and least loaded first."""
        t0 = time.monotonic()
        waited = False
        while (idx := self._place(session_id, need, pick, replicas)) is None:
            waited = True
            if self._changed is None:
                self._changed = asyncio.Event()
            with contextlib.suppress(TimeoutError):  # health changes do not notify: look again now and then
                await asyncio.wait_for(self._changed.wait(), RECHECK_S)
        if session_id and all(session_id not in ledger.held for ledger in self._ledgers):
            self._admitted.setdefault(session_id, None)
            if len(self._admitted) > MAX_TRACKED:  # a caller that never ends its sessions: forget the oldest
                oldest = next(iter(self._admitted))
                del self._admitted[oldest]
                self._context.pop(oldest, None)
                self._learn()
        self._hold(idx, session_id, need)
        return idx, time.monotonic() - t0 if waited else 0.0

    def _place(self, session_id: str, need: int, pick: Callable[[], int], replicas: Sequence[Replica]) -> int | None:
        idx = pick()
        if self.fits(idx, session_id, need):
            return idx
        now = time.monotonic()
        room = [i for i, r in enumerate(replicas) if r.healthy(now) and self.fits(i, session_id, need)]
        return min(room, key=lambda i: (replicas[i].outstanding, i)) if room else None

    def _hold(self, idx: int, session_id: str, tokens: int) -> None:
        for i, ledger in enumerate(self._ledgers):  # a session holds room on one replica only
            if i != idx:
                ledger.held.pop(session_id, None)
        self._ledgers[idx].held[session_id] = tokens

    def finish(self, idx: int, session_id: str, context_tokens: int | None) -> None:
        """A turn admitted on `idx` ended: the session now holds `context_tokens` there (None: the turn
        failed, the session holds nothing there)."""
        ledger = self._ledgers[idx]
        if context_tokens is None or not session_id:
            ledger.held.pop(session_id, None)
        else:
            ledger.held[session_id] = context_tokens
            self._context[session_id] = context_tokens
        self._notify()

    def end(self, session_id: str) -> None:
        """The session ended: its room frees, and its final context teaches the expected peak."""
        for ledger in self._ledgers:
            ledger.held.pop(session_id, None)
        final = self._context.pop(session_id, None)
        if session_id in self._admitted:
            self._admitted[session_id] = final or 0
            self._learn()
        self._notify()

    def _learn(self) -> None:
        """Fold in the ended episodes at the front of the admission order (each once all before it ended)."""
        while self._admitted:
            first = next(iter(self._admitted))
            final = self._admitted[first]
            if final is None:
                return
            del self._admitted[first]
            if final:
                self._peaks += 1
                self._peak += (final - self._peak) / min(self._peaks, WINDOW)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
