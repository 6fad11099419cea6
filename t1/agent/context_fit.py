"""An episode's context compaction: when the next turn might not fit, its context becomes a compacted one.

Before each generation `fit` checks the room left: past the trigger it compacts with the rule's note
(t1/agent/compaction.py) and a new segment starts; when even that leaves no room the episode ends at
its context limit. With policy compaction, `wants_summary` says whether the observation about to be
appended should carry the summary request, and `by_summary` compacts with the policy's answer (or the
rule's note when the answer is malformed or there is no room for one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from t1.agent.compaction import SUMMARY_REQUEST, Message, RecentCommands, compact_messages, summary_compacted
from t1.agent.episode_limits import EpisodeLimits
from t1.agent.episode_types import _End
from t1.agent.transcript import Transcript
from t1.metrics import registry as m
from t1.tito import ChatRenderer, TokenBuffer
from t1.trajectory.types import EpisodeStatus

Summarize = Callable[[int], Awaitable[str | None]]  # the policy's summary within a token budget; None: malformed


class ContextFit:
    """Keeps one episode's context within its limits; `segments` counts the segments it has started."""

    def __init__(self, limits: EpisodeLimits, max_tokens: int, renderer: ChatRenderer, num_opening: int,
                 commands: RecentCommands, tx: Transcript, on_new_segment: Callable[[], None]) -> None:
        """`max_tokens`: a turn's generation budget; `commands`: the episode's last commands (the rule's note);
        `on_new_segment`: called when a compaction ends the segment (its generate session ends)."""
        self._limits, self._max_tokens, self._renderer = limits, max_tokens, renderer
        self._num_opening, self._commands, self._tx = num_opening, commands, tx
        self._on_new_segment = on_new_segment
        self._summary_ask_tokens = len(renderer.encode(SUMMARY_REQUEST)) + 16 if limits.compaction_by_policy else 0
        self.segments = 1

    def fit(self, buf: TokenBuffer) -> None:
        """Compact (new segment, the rule's note) when the next turn might not fit; context_limit when it cannot."""
        limits = self._limits
        need = len(buf.prompt_ids()) + self._max_tokens
        if need <= limits.max_context_tokens * limits.compaction_trigger:
            return
        if limits.compaction and self.segments < limits.max_segments:
            m.COMPACTIONS.labels(note="rule").inc()
            self._compact(buf, compact_messages(buf.messages, self._num_opening, limits.keep_last_turns,
                                                self._commands))
            if len(buf.prompt_ids()) + self._max_tokens <= limits.max_context_tokens:
                return
        if need > limits.max_context_tokens:
            raise _End(EpisodeStatus.CONTEXT_LIMIT, f"context {need} tokens > {limits.max_context_tokens}")

    def wants_summary(self, buf: TokenBuffer, observation: list[Message]) -> bool:
        """Policy compaction: whether the turn after this observation would pass the trigger (its tokens: its
        contents' and the request's, plus a template allowance per message), so the observation carries the
        summary request."""
        limits = self._limits
        if not (limits.compaction_by_policy and limits.compaction and self.segments < limits.max_segments):
            return False
        texts = [str(msg.get("content") or "") for msg in observation]
        tokens = sum(len(self._renderer.encode(t)) + 16 for t in texts) + self._summary_ask_tokens
        need = len(buf.prompt_ids()) + tokens + self._max_tokens
        return need > limits.max_context_tokens * limits.compaction_trigger

    async def by_summary(self, buf: TokenBuffer, summarize: Summarize) -> None:
        """The policy writes the note: it answers the summary request that closes the observation just appended
        (its tokens end this segment, trained with the episode's return); the next segment opens with the summary
        and the last turns. A malformed summary, or no room for one, gives the rule's note (counted)."""
        limits = self._limits
        before = buf.messages[:-1]  # up to the observation, without the request
        budget = min(limits.summary_max_tokens, limits.max_context_tokens - len(buf.prompt_ids()))
        summary = await summarize(budget) if budget >= 8 else None
        m.COMPACTIONS.labels(note="policy" if summary is not None else "fallback").inc()
        self._compact(buf, summary_compacted(before, self._num_opening, limits.keep_last_turns, summary)
                      if summary is not None else
                      compact_messages(before, self._num_opening, limits.keep_last_turns, self._commands))

    def _compact(self, buf: TokenBuffer, messages: list[Message]) -> None:
        buf.compact(messages)
        self._on_new_segment()
        self.segments += 1
        self._tx.note(f"context compacted: new segment {self.segments} starts with {len(buf.prompt_ids())} tokens")
