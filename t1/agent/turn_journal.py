"""The seam between an episode and its journal (t1/coordinator/spool/journal.py is the real one).

A journaled episode hands every change of its token buffer and the end of every turn to the
journal as they happen, keeps only what its next turn needs, and builds its trajectory at the end
by reading the journal back.
"""

from __future__ import annotations

from typing import Any, Protocol

from t1.tito.buffer import BufferSink


class TurnJournal(BufferSink, Protocol):
    def begin(self, **fields: Any) -> None:
        """The episode's identity (task, group, attempt, agent format), before its first segment."""

    def turn(self, **fields: Any) -> None:
        """A turn ended: its index, commands with exit codes, bad reply, checkpoint, the next observation, the
        shell's state, the buffer's counters (what a resume needs: t1/agent/resume_point.py)."""

    def sandbox(self, **fields: Any) -> None:
        """The sandbox the episode got: its id and its provider's record (how a restarted coordinator reattaches)."""

    def ready(self, **fields: Any) -> None:
        """The sandbox is provisioned (how shells start) and the verifier baseline measured: turns follow."""

    def resumed(self, **fields: Any) -> None:
        """A restarted coordinator continues the episode from here."""

    async def room(self) -> None:
        """Until the journal can take another turn (its writer keeps up with the disk): awaited before each turn."""

    async def written(self) -> None:
        """Until every record so far can be read back."""

    def read(self) -> list[tuple[str, dict[str, Any]]]:
        """Every record, in order (blocking: called off the event loop)."""
