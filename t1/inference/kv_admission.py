"""Admission by KV headroom: a turn starts only where the replica has room for its context.

Each replica reports its KV capacity in tokens (GetModelInfo.kv_capacity_tokens; 0: no bound). The
pool keeps a ledger per replica: the positions each bound session holds there (its context after
its last turn) and, for a turn in flight, its prompt and max_tokens. A turn is admitted on a replica
when the other sessions' holdings plus its own need fit in the capacity; otherwise it waits until a
turn ends or a session ends (`end_session`) there. A new session (an episode's first turn) goes to a
replica where it fits, and waits while none has room, so episodes are admitted by headroom; the
rollout's `max_concurrent_episodes` stays an upper bound on top. With `kv_expected_context_tokens`
every session holds at least that much (its expected peak context), so an episode is admitted only
where its growth has room, and admitted episodes seldom contend later.

Preemption rule (the one way a resident session's cache is given up): a session already resident on
a replica that cannot fit its next turn still starts it when nothing is in flight on that replica
(every other session there is between turns, so no room would ever free by itself). The server's
cache LRU then drops the least recently used idle session's cache; that session's next turn is
prefilled again, whole, with its routes (t1.routing.concat: the later block wins). No turn is ever
evicted mid-generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

RECHECK_S = 0.5  # a waiting turn looks again this often (a replica's health changes without a notice)


@dataclass(slots=True)
class _Ledger:
    capacity: int | None = None                         # None: not asked yet; 0: no bound
    held: dict[str, int] = field(default_factory=dict)  # session -> positions
    running: int = 0

    @property
    def used(self) -> int:
        return sum(self.held.values())


class KvAdmission:
    """The per-replica ledgers, and the wait for room."""

    def __init__(self, replicas: int, expected_context: int = 0) -> None:
        self.expected_context = expected_context  # the least a session holds (its expected peak context)
        self._ledgers = [_Ledger() for _ in range(replicas)]
        self._changed: asyncio.Event | None = None  # set (and replaced) when room may have freed

    def known(self, idx: int) -> bool:
        return self._ledgers[idx].capacity is not None

    def set_capacity(self, idx: int, tokens: int) -> None:
        self._ledgers[idx].capacity = max(0, tokens)

    def usage(self, idx: int) -> tuple[int, int]:
        """(capacity, used) of one replica's ledger, in tokens (capacity 0: no bound or not known)."""
        ledger = self._ledgers[idx]
        return ledger.capacity or 0, ledger.used

    def fits(self, idx: int, session_id: str, need: int) -> bool:
        ledger = self._ledgers[idx]
        if not ledger.capacity:
            return True
        others = ledger.used - ledger.held.get(session_id, 0)
        if others + max(need, self.expected_context) <= ledger.capacity:
            return True
        return session_id in ledger.held and ledger.running == 0  # the preemption rule (module docstring)

    async def admit(self, session_id: str, need: int, place: Callable[[], int | None]) -> tuple[int, float]:
        """Wait until `place()` names a replica where the turn fits (None: none does), hold `need` there;
        returns the replica and how long the turn waited."""
        t0 = time.monotonic()
        waited = False
        while (idx := place()) is None:
            waited = True
            if self._changed is None:
                self._changed = asyncio.Event()
            with contextlib.suppress(TimeoutError):  # health changes do not notify: look again now and then
                await asyncio.wait_for(self._changed.wait(), RECHECK_S)
        waited_s = time.monotonic() - t0 if waited else 0.0
        self._hold(idx, session_id, max(need, self.expected_context))
        self._ledgers[idx].running += 1
        return idx, waited_s

    def _hold(self, idx: int, session_id: str, tokens: int) -> None:
        for i, ledger in enumerate(self._ledgers):  # a session holds room on one replica only
            if i != idx:
                ledger.held.pop(session_id, None)
        self._ledgers[idx].held[session_id] = tokens

    def finish(self, idx: int, session_id: str, context_tokens: int | None) -> None:
        """A turn admitted on `idx` ended: the session now holds `context_tokens` there (None: the turn
        failed, the session holds nothing there)."""
        ledger = self._ledgers[idx]
        ledger.running -= 1
        if context_tokens is None or not session_id:
            ledger.held.pop(session_id, None)
        else:
            ledger.held[session_id] = max(context_tokens, self.expected_context)
        self._notify()

    def end(self, session_id: str) -> None:
        for ledger in self._ledgers:
            ledger.held.pop(session_id, None)
        self._notify()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
