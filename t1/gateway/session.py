"""One episode's gateway session: chat calls in, exact-token generations out, all of it in the TITO buffer.

    call 1:   messages --template (with the call's tools)--> ids: the buffer's opening (segment 1)
    call k:   messages == the last call's messages + the reply as given + new messages (tool results,
              user text)?  continue: only the new messages' delta is tokenized and appended (its anchor
              checks the last turn renders as sampled, every call; the buffer's full-history check runs
              every 32 calls, when a segment ends and at export, as in T1's own loop: O(context) per
              call would make an episode quadratic): what the sampler sees is what the template renders
              otherwise: a new segment from the call's messages, counted by cause (SegmentCause)
    each:     generate on the buffer's ids (session affinity, exact ids, logprobs, routing) -> the
              reply parsed into content, reasoning and tool calls -> appended to the buffer

The sampling a harness asks for is honoured within the run's bounds (`rollout.harness.sampling`)
and recorded per call (`records`). Errors a harness can cause (a bad request, a context past the
limit) are `BadCall`s it sees as HTTP 400; generation failing past the retries is
`GatewayInferenceFailed`, which ends the episode as an infra error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from t1.agent.policy_call import call_policy
from t1.config.rollout import HarnessConfig
from t1.errors import InfraError
from t1.gateway.call import BadCall, ChatCall, Completion, Message, StopWhy, new_id, parse_reply
from t1.gateway.renderers import ToolRenderers
from t1.inference.types import (
    FinishReason,
    GenerateFn,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    SessionGenerateFn,
)
from t1.metrics import registry as m
from t1.tito import ChatRenderer, MismatchPolicy, TokenBuffer
from t1.tito.diagnostics import segment_drift
from t1.trajectory.types import Segment, TitoCounters

log = logging.getLogger(__name__)


class SegmentCause(StrEnum):
    """Why a call started a new segment."""

    FIRST = "first"                          # the episode's first call
    TOOLS_CHANGED = "tools_changed"          # the call's tools differ from the segment's
    HISTORY_REWRITTEN = "history_rewritten"  # an earlier message changed, was dropped or re-ordered (compaction)
    REPLY_REWRITTEN = "reply_rewritten"      # the harness's copy of the last reply differs (reasoning dropped, ...)
    NO_REPLY = "no_reply"                    # the call does not carry the last reply (a retry, a parallel call)
    TEMPLATE_REWROTE = "template_rewrote"    # the messages extend the last call, the template renders them
                                             # otherwise (recorded as template_rewrote:<the buffer's MismatchCause>)


class GatewayInferenceFailed(InfraError):
    """Generation failed on every try: the episode ends as infra_error."""


@dataclass(frozen=True, slots=True)
class CallRecord:
    """What one call asked and got (the gateway's log of the episode)."""

    index: int
    segment: int
    cause: str             # "" (continued) or a SegmentCause
    prompt_tokens: int
    new_tokens: int        # ids the call added to the buffer before generating (its delta, or a whole opening)
    completion_tokens: int
    asked: dict[str, Any]
    used: dict[str, Any]
    stop: str
    seconds: float


class GatewaySession:
    """The gateway's state for one episode (one harness process talks to it at a time: calls are serialised)."""

    def __init__(self, episode_id: str, generate: GenerateFn, renderer: ChatRenderer | ToolRenderers,
                 run_sampling: SamplingParams,
                 cfg: HarnessConfig, max_context_tokens: int, turn_retries: int) -> None:
        self.episode_id = episode_id
        self._generate = generate
        self._run = run_sampling
        self._cfg = cfg
        self._max_context = max_context_tokens
        self._retries = turn_retries
        self._tool_renderers = renderer if isinstance(renderer, ToolRenderers) else ToolRenderers(renderer)
        self._buffers: list[TokenBuffer] = []  # a change of tools starts a buffer (a renderer) of its own
        self._tools_key = ""
        self._lock = asyncio.Lock()
        self.causes: Counter[str] = Counter()  # segment starts with a generation, by cause
        self._unborn = ""  # the cause of a segment started by a call that has no generation yet
        self.records: list[CallRecord] = []
        # The sampler's record, apart from the buffers: (buffer, its segment, start position, sampled ids).
        self.sampled: list[tuple[int, int, int, np.ndarray]] = []
        self.inference_failed: str | None = None

    @property
    def calls(self) -> int:
        return len(self.records)

    @property
    def buf(self) -> TokenBuffer | None:
        """The current buffer (None before the first call)."""
        return self._buffers[-1] if self._buffers else None

    @property
    def session_id(self) -> str:
        """The generate session of the current segment (one per segment, as in T1's own loop)."""
        return f"{self.episode_id}/b{len(self._buffers)}s{0 if self.buf is None else self.buf.num_segments}"

    def end(self) -> None:
        """The episode is over: the inference pool forgets the session."""
        self._end_segment_session()

    def _renderer(self, tools: tuple[dict[str, Any], ...]) -> tuple[ChatRenderer, str]:
        return self._tool_renderers.get(tools)

    async def complete(self, call: ChatCall) -> Completion:
        if self.inference_failed is not None:
            raise GatewayInferenceFailed(self.inference_failed)
        if self.calls >= self._cfg.max_calls:
            raise BadCall(f"this episode's call limit ({self._cfg.max_calls}, rollout.harness.max_calls) is reached")
        if call.messages[-1]["role"] not in ("user", "tool", "system"):
            raise BadCall("the last message must be a user, tool or system message (the gateway generates the "
                          "assistant's next turn)")
        async with self._lock:
            t0 = time.monotonic()
            before = 0 if self.buf is None else len(self.buf.prompt_ids())
            renderer, tools_key = self._renderer(call.tools)  # once per call: the key serialises the tools
            cause = self._place(call, renderer, tools_key)
            buf = self.buf
            assert buf is not None
            seg = sum(b.num_segments for b in self._buffers) - 1
            prompt = buf.prompt_ids()
            new_tokens = len(prompt) - (before if not cause else 0)
            if cause:  # counted once the segment has a generation: the counts are the trajectory's segments
                self._unborn = cause
            room = self._max_context - len(prompt)
            if room < 1:
                raise BadCall(f"context_length_exceeded: the prompt is {len(prompt)} tokens, the model's context "
                              f"is {self._max_context}")
            sampling, used = self._sampling(call, room)
            result = await self._generate_with_retries(GenerateRequest(self.session_id, prompt, sampling), call,
                                                       renderer)
            ids = result.token_ids.tolist()
            ended = renderer.end_length(ids)
            content, reasoning, tool_calls = parse_reply(renderer.decode(ids[:len(ids) - ended] if ended else ids))
            stop = StopWhy.LENGTH if result.finish_reason is FinishReason.LENGTH and not ended else (
                StopWhy.TOOL_CALLS if tool_calls else StopWhy.STOP)
            completion = Completion(new_id("chatcmpl-"), content, reasoning, tool_calls, stop, len(prompt), len(ids),
                                    result.cached_tokens)
            self.sampled.append((len(self._buffers) - 1, buf.num_segments - 1, len(prompt), np.array(ids, np.int64)))
            buf.append_generation(result, completion.message())
            cause, self._unborn = self._unborn, ""
            if cause:
                self.causes[cause] += 1
                m.GATEWAY_SEGMENTS.labels(cause=cause).inc()
            self.records.append(CallRecord(self.calls, seg, cause, len(prompt), new_tokens, len(ids), _asked(call),
                                           used, stop.value, round(time.monotonic() - t0, 4)))
            m.GATEWAY_CALLS.inc()
            return completion

    def _place(self, call: ChatCall, renderer: ChatRenderer, key: str) -> str:
        """Put the call's messages into the buffer: continue the segment ("") or start one (its cause)."""
        messages = list(call.messages)
        buf = self.buf
        if buf is None or key != self._tools_key:
            if buf is not None:
                self._end_segment_session()
            self._buffers.append(
                TokenBuffer(renderer, messages, on_mismatch=MismatchPolicy(self._cfg.on_template_rewrite))
            )
            self._tools_key = key
            return SegmentCause.FIRST if buf is None else SegmentCause.TOOLS_CHANGED
        held = buf.messages
        if held[-1]["role"] != "assistant" and messages == held:
            return ""  # the call that failed before its reply, asked again: nothing new to add
        cause = _cause(held, messages)
        if cause is None:
            segments, before = buf.num_segments, buf.mismatch_causes
            buf.append_observation(messages[len(held):])
            if buf.num_segments == segments:
                return ""
            self._end_segment_session(segments)
            # The buffer's own cause of the mismatch: the generation prompt, reasoning, tool calls, a turn, history.
            after = buf.mismatch_causes
            how = [str(c) for c in after if after[c] > before.get(c, 0)]
            return f"{SegmentCause.TEMPLATE_REWROTE}:{'+'.join(how) or 'history'}"
        self._end_segment_session()
        buf.compact(messages)
        return cause

    def _end_segment_session(self, segments: int | None = None) -> None:
        """The inference pool forgets the session of a segment that ended (the current one by default)."""
        if isinstance(self._generate, SessionGenerateFn) and self.buf is not None:
            self._generate.end_session(f"{self.episode_id}/b{len(self._buffers)}"
                                       f"s{self.buf.num_segments if segments is None else segments}")

    def _sampling(self, call: ChatCall, room: int) -> tuple[SamplingParams, dict[str, Any]]:
        run, asked, bounds = self._run, call.sampling, self._cfg.sampling
        max_tokens = min(asked.max_tokens or run.max_tokens, run.max_tokens, room)
        if bounds.honour == "run":
            s = SamplingParams(run.temperature, run.top_p, run.top_k, run.seed, run.stop_token_ids, max_tokens)
        else:
            temperature = run.temperature if asked.temperature is None else \
                min(max(asked.temperature, bounds.min_temperature), bounds.max_temperature)
            top_p = run.top_p if asked.top_p is None else max(min(asked.top_p, 1.0), bounds.min_top_p)
            top_k = run.top_k if asked.top_k is None else asked.top_k
            s = SamplingParams(temperature, top_p, top_k, asked.seed, run.stop_token_ids, max_tokens)
        return s, {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "seed": s.seed,
                   "max_tokens": s.max_tokens}

    async def _generate_with_retries(self, request: GenerateRequest, call: ChatCall,
                                     renderer: ChatRenderer) -> GenerateResult:
        last: BaseException | None = None
        for attempt in range(self._retries + 1):
            try:
                result, _ = await call_policy(self._generate, request, self.buf.messages if self.buf else [],
                                              list(call.tools) or None, renderer)
                return result
            except (ValueError, TypeError):
                raise
            except Exception as exc:  # the fault-tolerance point: the same exact context again
                last = exc
                m.INFERENCE_RETRIES.inc()
                log.warning("gateway %s call %d: generate failed (try %d): %s", self.episode_id, self.calls,
                            attempt + 1, exc)
        self.inference_failed = f"generate failed {self._retries + 1} times: {last}"
        raise GatewayInferenceFailed(self.inference_failed)

    def segments(self) -> tuple[tuple[Segment, ...], int, TitoCounters]:
        """The episode's segments in order (every buffer's, each with at least one generation), the TITO
        drift of their loss region against the sampler's record (must be 0), and the buffers' counters."""
        out: list[Segment] = []
        drift = 0
        for b, buf in enumerate(self._buffers):
            with_turns = sorted({s for bb, s, _, _ in self.sampled if bb == b})
            segs = buf.segments()
            if len(segs) != len(with_turns):
                raise RuntimeError(f"gateway {self.episode_id}: buffer {b} has {len(segs)} segments with turns, "
                                   f"the sampler's record {len(with_turns)}")
            for seg, s in zip(segs, with_turns, strict=True):
                drift += segment_drift(seg, [(start, ids) for bb, ss, start, ids in self.sampled if (bb, ss) == (b, s)])
                out.append(seg)
        return tuple(out), drift, self.counters()

    def counters(self) -> TitoCounters:
        """The TITO counters of all the episode's buffers."""
        cs = [b.counters for b in self._buffers]
        return TitoCounters(sum(c.repaired_turns for c in cs), sum(c.masked_tokens for c in cs),
                            sum(c.template_mismatches for c in cs))


def _cause(held: list[Message], messages: list[Message]) -> SegmentCause | None:
    """None when `messages` extend `held` (the buffer's conversation, ending with the last reply) by new
    turns; else why they do not."""
    n = len(held)
    if held[-1]["role"] != "assistant":  # the last call got no reply (it failed): a fresh segment
        return SegmentCause.NO_REPLY
    if messages[:n - 1] != held[:n - 1]:
        return SegmentCause.HISTORY_REWRITTEN
    if len(messages) < n or messages[n - 1]["role"] != "assistant":
        return SegmentCause.NO_REPLY
    if messages[n - 1] != held[n - 1]:
        return SegmentCause.REPLY_REWRITTEN
    if any(msg["role"] == "assistant" for msg in messages[n:]):
        return SegmentCause.HISTORY_REWRITTEN
    return None


def _asked(call: ChatCall) -> dict[str, Any]:
    s = call.sampling
    asked: dict[str, Any] = {k: v for k, v in (("temperature", s.temperature), ("top_p", s.top_p), ("top_k", s.top_k),
                                ("max_tokens", s.max_tokens), ("seed", s.seed)) if v is not None}
    if s.stop:
        asked["stop"] = list(s.stop)  # recorded, not applied: stop strings would cut sampled ids mid-token
    return asked
