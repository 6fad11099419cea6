"""The TITO token buffer of one episode: exact context ids for the sampler, the trajectory for the trainer.

    start:        opening messages --chat template--> ids (context, loss mask off)
    each turn:    prompt_ids() -> generate -> append_generation(result)  (sampled ids, loss mask on,
                  logprobs, versions, routing; missing end-of-turn appended masked = repair)
                  append_observation(messages)  (delta text tokenized alone, loss mask off)
    compaction:   compact(messages) starts a new segment from the compacted conversation
    end:          export(...) -> Trajectory

Sampled tokens are never re-tokenized. A turn costs O(its own tokens), not O(context): the buffer
keeps the messages and its decoded text as it grows (each chunk decoded once), renders each delta
in a bounded anchor (ChatRenderer.delta) and prompt_ids() is a view, not a copy.

Template checks, two levels (on a failure the buffer either keeps its tokens and appends the delta,
or starts a new segment from the re-rendered conversation: MismatchPolicy; counted by cause; the
episode continues, the buffer never raises on a template its renderer accepted):
- every observation, the anchor: the turn's context, its generation prompt and the last assistant
  turn render as the buffer holds them once the new messages follow (re-serialised tool calls,
  reasoning stripped, an empty think block the prompt had and the history has not);
- every `full_check_every` observations, at compaction and at export, the full history: the whole
  conversation renders to text that starts with the buffer's, which catches templates that rewrite
  turns further back (Qwen3 stripping the reasoning of all turns before a new user query). It is
  skipped once a mismatch has been counted in the segment: under REPAIR the buffer then differs
  from the rendering for good, and a template mismatch is counted once per divergence, not per turn.

Journaled (a `sink`): every change is handed to the sink as it happens (segment starts,
generations, observations) and the buffer keeps only the ids, the messages and the counters; the
logprobs, versions, loss mask and routing live in the sink (the episode's journal on disk), and the
trajectory is built by replaying it (t1/tito/replay.py), byte-identical to an unjournaled export.
`restore` rebuilds such a buffer from its journal's events and `resume_state()` (what the events do
not hold: the template checks' counts), as it was live: a restarted coordinator continues the episode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

from t1.inference.types import GenerateResult
from t1.routing.block import RoutingBlock
from t1.tito.diagnostics import REPAIRED_TURNS, TEMPLATE_MISMATCHES
from t1.tito.render import ChatRenderer, Message, MismatchCause, anchor_context
from t1.tito.segment import SegmentBuilder
from t1.trajectory.types import (
    EpisodeStatus,
    Segment,
    TitoCounters,
    Trajectory,
    TurnSpan,
    VerifierSummary,
)


class MismatchPolicy(StrEnum):
    REPAIR = "repair"            # keep the buffer's tokens, append the delta after them
    NEW_SEGMENT = "new_segment"  # start a new segment from the re-rendered conversation


class BufferSink(Protocol):
    """Receives every change of a journaled TokenBuffer, in order; replaying them rebuilds its segments."""

    def segment(self, ids: np.ndarray, messages: Sequence[Message], shared_prefix: int) -> None:
        """A segment starts with these ids; its first `shared_prefix` positions have the previous segment's routing."""

    def generation(self, start: int, ids: np.ndarray, logprobs: np.ndarray, versions: np.ndarray,
                   routing: RoutingBlock | None, message: Message, repair: np.ndarray, summary: bool = False) -> None:
        """Sampled ids appended at `start`, then `repair` (masked end-of-turn ids the sampler did not produce);
        `summary`: the policy's compaction summary, a generation that is no turn of the episode's."""

    def context(self, ids: np.ndarray, messages: Sequence[Message]) -> None:
        """Observation ids appended (loss mask off), rendered from `messages`."""


class TokenBuffer:
    """One episode's exact token record (see module docstring)."""

    def __init__(self, renderer: ChatRenderer, messages: Sequence[Message], *,
                 on_mismatch: MismatchPolicy = MismatchPolicy.REPAIR, full_check_every: int = 32,
                 sink: BufferSink | None = None) -> None:
        if not messages:
            raise ValueError("a token buffer needs at least one opening message")
        if full_check_every < 0:
            raise ValueError(f"full_check_every must be >= 0 (0: only at compaction and export), "
                             f"got {full_check_every}")
        self.full_check_every = full_check_every
        self.renderer = renderer
        self.on_mismatch = MismatchPolicy(on_mismatch)
        self.sink = sink
        self._closed: list[SegmentBuilder] = []
        self._repaired = self._masked = self._mismatches = 0
        self._causes: dict[MismatchCause, int] = {}
        self._generations = 0
        self._summaries: list[int] = []  # the generation index of each compaction summary
        self._start_segment(messages, previous=None)

    def _start_segment(self, messages: Sequence[Message], previous: SegmentBuilder | None) -> None:
        self._messages: list[Message] = list(messages)
        self._seg = SegmentBuilder(keep_arrays=self.sink is None)
        opening = np.asarray(self.renderer.encode_conversation(messages, True), np.int32)
        self._seg.append_context(opening)
        shared = 0
        self._text: list[str] = [self.renderer.decode(opening.tolist())]  # the segment's ids, decoded by chunk
        self._turn_text = ""   # the last generation's ids (and repair), decoded
        self._synced = True    # no template mismatch counted in this segment yet
        self._since_check = 0  # observations since the last full-history check
        if previous is not None:
            # A prefix shared with the previous segment is served from the sampler's cache and not
            # reported again; its routing is the previous segment's (same ids, causal model).
            old, new = previous.ids(), self._seg.ids()
            n = min(len(old), len(new))
            diff = np.flatnonzero(old[:n] != new[:n])
            shared = int(diff[0]) if len(diff) else n
            block = previous.routing_prefix(shared) if previous.keep_arrays else None
            if block is not None:
                self._seg.add_routing(block)
        if self.sink is not None:
            self.sink.segment(opening, self._messages, shared)
            if previous is not None:
                previous.drop_ids()  # a closed lean segment is in the journal: memory stays bounded by one segment

    @classmethod
    def restore(cls, renderer: ChatRenderer, events: Iterable[tuple[str, Mapping[str, Any]]],
                state: Mapping[str, Any], *, sink: BufferSink, on_mismatch: MismatchPolicy = MismatchPolicy.REPAIR,
                full_check_every: int = 32) -> TokenBuffer:
        """The journaled buffer whose sink received `events` (its segment, gen and ctx records, in order) and
        whose `resume_state()` was `state` after the last of them, as it was then: ids, messages, decoded text,
        counters. Nothing is sent to `sink` for the replayed events; later appends go to it."""
        buf = cls.__new__(cls)
        buf.full_check_every, buf.renderer, buf.on_mismatch, buf.sink = full_check_every, renderer, on_mismatch, sink
        buf._closed, buf._generations, buf._summaries = [], 0, []
        seg: SegmentBuilder | None = None
        for kind, f in events:
            if kind == "segment":
                if seg is not None:
                    seg.drop_ids()
                    buf._closed.append(seg)
                seg = buf._seg = SegmentBuilder(keep_arrays=False)
                ids = np.asarray(f["ids"], np.int32)
                seg.append_context(ids)
                buf._messages, buf._text, buf._turn_text = list(f["messages"]), [renderer.decode(ids.tolist())], ""
                buf._since_check = 0
            elif seg is None:
                raise ValueError(f"a {kind!r} record before the buffer's first segment")
            elif kind == "gen":
                ids, repair = np.asarray(f["ids"], np.int32), np.asarray(f["repair"], np.int32)
                seg.append_sampled(ids, f["logprobs"], f["versions"])
                if f.get("summary"):
                    buf._summaries.append(buf._generations)
                buf._generations += 1
                buf._turn_text = renderer.decode(ids.tolist())
                if len(repair):
                    seg.append_context(repair)
                    buf._turn_text += renderer.decode(repair.tolist())
                buf._messages.append(f["message"])
                buf._text.append(buf._turn_text)
            elif kind == "ctx":
                ids = np.asarray(f["ids"], np.int32)
                seg.append_context(ids)
                buf._text.append(renderer.decode(ids.tolist()))
                buf._messages.extend(f["messages"])
                buf._since_check += 1
                if full_check_every > 0 and buf._since_check >= full_check_every:
                    buf._since_check = 0
        if seg is None:
            raise ValueError("a journal without a segment: no buffer to restore")
        buf._repaired, buf._masked, buf._mismatches = int(state["repaired"]), int(state["masked"]), \
            int(state["mismatches"])
        buf._causes = {MismatchCause(c): int(n) for c, n in dict(state["causes"]).items()}
        buf._synced = bool(state["synced"])
        return buf

    def resume_state(self) -> dict[str, Any]:
        """What `restore` cannot recompute from the events (the template checks' counts); JSON-able."""
        return {"repaired": self._repaired, "masked": self._masked, "mismatches": self._mismatches,
                "causes": {c.value: n for c, n in self._causes.items()}, "synced": self._synced}

    def prompt_ids(self) -> np.ndarray:
        """The current segment's full exact context: a read-only int32 view (no copy), the next
        generate request's prompt.

        Guarantee (the prompt-delta client relies on it, t1.inference.prompt_delta.SentContexts): the
        ids of a view handed out here never change, nor do those of the array it views up to the
        view's end. Later turns only append after them (growing into a new array when full), and a
        new segment (compaction, a template mismatch under NEW_SEGMENT) gets an array of its own."""
        return self._seg.ids()

    @property
    def messages(self) -> list[Message]:
        """The conversation as the template sees it (current segment)."""
        return list(self._messages)

    @property
    def num_segments(self) -> int:
        """Segments started so far (the current one included)."""
        return len(self._closed) + 1

    @property
    def counters(self) -> TitoCounters:
        return TitoCounters(repaired_turns=self._repaired, masked_tokens=self._masked,
                            template_mismatches=self._mismatches)

    @property
    def mismatch_causes(self) -> dict[MismatchCause, int]:
        """Template mismatches counted so far, by cause (they sum to counters.template_mismatches)."""
        return dict(self._causes)

    def append_generation(self, result: GenerateResult, message: Message | None = None, *, summary: bool = False
                          ) -> TurnSpan:
        """Append the sampled ids of a generation made on prompt_ids(), with logprobs, versions and routing.

        message: the assistant message as the agent parsed it (tool calls, reasoning); default is the
        decoded text. A generation that did not end with the end-of-turn tokens gets them appended,
        masked out and counted. `summary`: the policy's compaction summary, a generation (a TurnSpan of
        its segment, trained with the episode's return) that is no turn of the episode's (`by_generation`).
        """
        prompt_len = len(self._seg)
        if result.prompt_tokens and result.prompt_tokens != prompt_len:
            raise ValueError(f"generation was made on a {result.prompt_tokens}-token prompt, the buffer "
                             f"holds {prompt_len}; call prompt_ids() for each request")
        ids = np.asarray(result.token_ids, np.int32)
        versions = (np.asarray(result.token_versions, np.int32) if len(result.token_versions)
                    else np.full(len(ids), result.policy_version, np.int32))
        span = self._seg.append_sampled(ids, result.logprobs, versions)
        if summary:
            self._summaries.append(self._generations)
        self._generations += 1
        if result.routing is not None and result.routing.num_tokens:
            self._seg.add_routing(result.routing)
        eot = self.renderer.end_of_turn_ids
        sampled = ids.tolist()
        end = self.renderer.end_length(sampled)
        self._turn_text = self.renderer.decode(sampled)
        repair = np.zeros(0, np.int32) if end else np.asarray(eot, np.int32)
        if not end:
            self._seg.append_context(np.asarray(eot, np.int32))
            self._turn_text += self.renderer.decode(eot)
            self._repaired += 1
            self._masked += len(eot)
            REPAIRED_TURNS.inc()
        if message is None:
            content_ids = ids[:len(ids) - end]
            message = {"role": "assistant", "content": self.renderer.decode(content_ids.tolist())}
        self._messages.append(message)
        self._text.append(self._turn_text)
        if self.sink is not None:
            self.sink.generation(span.start, ids, np.asarray(result.logprobs, np.float32), versions,
                                 result.routing if result.routing is not None and result.routing.num_tokens else None,
                                 message, repair, summary=summary)
        return span

    def by_generation(self, turn_rewards: Mapping[int, float]) -> dict[int, float]:
        """Rewards keyed by the episode's turns, keyed instead by generation (the segments' TurnSpans, whose
        index `export`'s turn_rewards takes): each compaction summary before a turn moves it one on."""
        out = {}
        for turn, reward in turn_rewards.items():
            g = turn
            for s in self._summaries:  # ascending
                if s <= g:
                    g += 1
            out[g] = reward
        return out

    def append_observation(self, messages: Sequence[Message]) -> np.ndarray:
        """Append messages that follow an assistant turn (tool results, user text) as a delta; returns its ids."""
        if not messages:
            raise ValueError("append_observation needs at least one message")
        if self._messages[-1].get("role") != "assistant":
            raise ValueError(f"observations follow an assistant turn; the last message is "
                             f"{self._messages[-1].get('role')!r}")
        last = self._messages[-1]
        # control texts the new messages spell (a command's output printing `<|im_start|>`) become plain tokens
        safe, placeholders = self.renderer.control.defuse(messages)
        try:
            delta = self.renderer.delta(anchor_context(self._messages), last, self._turn_text, safe)
        except Exception:  # a template that refuses the bounded anchor (it wants its real first messages):
            #                the delta in the whole history, O(context); an error there is the conversation's
            delta = self.renderer.delta(self._messages[:-1], last, self._turn_text, safe)
        if delta.cause is not None:
            self._count_mismatch(delta.cause)
            if self.on_mismatch is MismatchPolicy.NEW_SEGMENT:
                previous = self._close_segment()
                self._start_segment([*self._messages, *messages], previous)
                return self._seg.ids()
        ids = np.asarray(self.renderer.control.encode(delta.text, placeholders), np.int32)
        self._seg.append_context(ids)
        self._text.append(self.renderer.decode(ids.tolist()))
        self._messages.extend(messages)
        if self.sink is not None:
            self.sink.context(ids, messages)
        self._since_check += 1
        due = self.full_check_every > 0 and self._since_check >= self.full_check_every
        if due and not self._check_history() and self.on_mismatch is MismatchPolicy.NEW_SEGMENT:
            previous = self._close_segment()
            self._start_segment(self._messages, previous)
            return self._seg.ids()
        return ids

    def _count_mismatch(self, cause: MismatchCause) -> None:
        self._mismatches += 1
        self._causes[cause] = self._causes.get(cause, 0) + 1
        self._synced = False
        TEMPLATE_MISMATCHES.labels(cause=cause.value).inc()

    def _check_history(self) -> bool:
        """The full-history check (O(context)); counts a mismatch unless one is already counted in
        this segment (then the buffer is known to differ and the check is skipped)."""
        self._since_check = 0
        if not self._synced:
            return False
        messages, parts = self._messages, self._text
        if messages[-1].get("role") == "assistant" and len(parts) > 1:
            # A last assistant turn is checked by the anchor when an observation follows it, as
            # before: one that ends the episode or the segment does not count.
            messages, parts = messages[:-1], parts[:-1]
        if self.renderer.history_matches(messages, "".join(parts)):
            return True
        self._count_mismatch(MismatchCause.HISTORY)
        return False

    def compact(self, messages: Sequence[Message]) -> None:
        """Start a new segment from a compacted conversation (ends with a user/tool turn)."""
        if not messages:
            raise ValueError("compaction needs at least one message")
        self._start_segment(messages, self._close_segment())

    def _close_segment(self) -> SegmentBuilder:
        self._check_history()
        self._closed.append(self._seg)
        return self._seg

    def segments(self, turn_rewards: Mapping[int, float] | None = None) -> tuple[Segment, ...]:
        """All segments with at least one generation, each ending at its last sampled token;
        turn_rewards maps episode-wide turn index to reward."""
        return build_segments([*self._closed, self._seg], turn_rewards)

    def export(self, *, id: str, task_id: str, group_id: str, attempt: int, reward: float,
               status: EpisodeStatus, verifier: VerifierSummary | None = None,
               timings: Sequence[tuple[str, float]] = (),
               turn_rewards: Mapping[int, float] | None = None,
               replayed: Sequence[SegmentBuilder] | None = None) -> Trajectory:
        """The episode's Trajectory (after a last full-history check of the current segment). A journaled
        buffer needs `replayed`: its sink's record replayed into full builders (t1/tito/replay.py)."""
        self._check_history()
        if self.sink is not None and replayed is None:
            raise ValueError("a journaled buffer exports from its journal: pass the replayed segment builders")
        segments = self.segments(turn_rewards) if replayed is None else build_segments(replayed, turn_rewards)
        return Trajectory(id=id, task_id=task_id, group_id=group_id, attempt=attempt,
                          segments=segments, reward=reward, status=EpisodeStatus(status),
                          verifier=verifier or VerifierSummary(), timings=tuple(timings), tito=self.counters)


def build_segments(builders: Sequence[SegmentBuilder], turn_rewards: Mapping[int, float] | None = None
                   ) -> tuple[Segment, ...]:
    """The built segments of those with at least one generation; turn_rewards is keyed by episode-wide turn."""
    rewards = dict(turn_rewards or {})
    out, first = [], 0
    for b in builders:
        if b.num_turns:
            out.append(b.build(rewards, first))
        first += b.num_turns
    return tuple(out)
