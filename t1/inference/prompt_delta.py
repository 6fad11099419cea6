"""Prompt deltas: a turn sends the ids it adds to its session's context, not the whole context.

A session's next prompt is its last prompt, the ids the server sampled for it, then the new
observation. Sent whole, a 30,000-token context costs 120 KB and about 0.2 ms of client CPU per
turn, and the server parses it again. With a delta the request names the session's previous
request (`base_request_id`), how many leading ids of that request's context it keeps, and the ids
after them:

    client (InferencePool)                       server (InferenceServicer, or any server)
    SentContexts: session -> last request,       ServedContexts: session -> last request id and
      its prompt and sampled ids                   its context (prompt + sampled), LRU by tokens
    delta_for(prompt) checks that the prompt     full_prompt(msg) rebuilds prompt_ids, or raises
      continues it, on the same replica            BaseUnknown -> FAILED_PRECONDITION

The client sends a delta only after it saw the server answer the base request, and only when the
prompt provably continues that context (compared id by id). A server that lost the base (evicted,
restarted) answers FAILED_PRECONDITION and the client resends the whole prompt; one that predates
deltas answers INVALID_ARGUMENT (prompt_ids: required) and gets whole prompts from then on.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from t1.rpc.errors import FailedPrecondition, RequestError
from t1.rpc.tensors import from_tensor, to_tensor
from t1.v1 import inference_pb2 as pb

SERVED_CONTEXT_TOKENS = 1 << 26   # ids a server keeps for deltas: 256 MB of int32 (8,000 sessions of 8k tokens)
MIN_DELTA_SAVING = 64             # ids a delta must save before it is worth the bookkeeping


class BaseUnknown(FailedPrecondition):
    """The server does not hold the context a delta continues (FAILED_PRECONDITION)."""


class ServedContexts:
    """Server side: each session's last served context, for the next request's delta."""

    def __init__(self, max_tokens: int = SERVED_CONTEXT_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._contexts: OrderedDict[str, tuple[str, np.ndarray]] = OrderedDict()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._contexts)

    def full_prompt(self, msg: pb.GenerateRequest) -> np.ndarray:
        """The request's whole prompt, int32 [n]: prompt_ids, or the delta on its session's context."""
        has_ids, has_delta = msg.HasField("prompt_ids"), msg.HasField("prompt_delta")
        if has_ids and has_delta:
            raise RequestError("prompt_ids, prompt_delta: set one, not both")
        if not has_delta:
            if not has_ids:
                raise RequestError("prompt_ids: required")
            return from_tensor(msg.prompt_ids, "prompt_ids", dtype="int32", ndim=1)
        delta = msg.prompt_delta
        suffix = from_tensor(delta.suffix_ids, "prompt_delta.suffix_ids", dtype="int32", ndim=1)
        served = self._contexts.get(msg.session_id)
        if served is None or served[0] != delta.base_request_id:
            raise BaseUnknown(f"prompt_delta: this server holds no context of request {delta.base_request_id!r} "
                              f"of session {msg.session_id!r} (evicted or restarted); send prompt_ids")
        context = served[1]
        if not 0 < delta.base_tokens <= len(context):
            raise BaseUnknown(f"prompt_delta.base_tokens: {delta.base_tokens} is outside 1..{len(context)}, "
                              f"the context of request {delta.base_request_id!r}; send prompt_ids")
        return np.concatenate([context[:delta.base_tokens], suffix])

    def remember(self, session_id: str, request_id: str, prompt: np.ndarray, sampled: np.ndarray) -> None:
        """A served request's context, the base for its session's next delta (replaces the last one)."""
        if not session_id or not request_id:
            return
        context = np.concatenate([np.asarray(prompt, np.int32), np.asarray(sampled, np.int32)])
        old = self._contexts.pop(session_id, None)
        if old is not None:
            self._tokens -= len(old[1])
        self._contexts[session_id] = (request_id, context)
        self._tokens += len(context)
        while self._tokens > self.max_tokens and self._contexts:
            _, (_, dropped) = self._contexts.popitem(last=False)
            self._tokens -= len(dropped)


@dataclass(slots=True)
class _Sent:
    replica: str  # its address
    request_id: str
    sampled: np.ndarray
    n_prompt: int
    owner: weakref.ref[np.ndarray] | None  # the read-only prompt's base array: prompt == owner[:n_prompt]
    copy: np.ndarray | None                # else a copy of the prompt
    at: float

    def prompt(self) -> np.ndarray | None:
        if self.copy is not None:
            return self.copy
        owner = self.owner() if self.owner is not None else None
        return None if owner is None else owner[:self.n_prompt]


def _owner(prompt: np.ndarray) -> np.ndarray | None:
    """The array a read-only prompt is the start of (TokenBuffer's growing id array), if any."""
    base = prompt.base
    if (prompt.flags.writeable or not isinstance(base, np.ndarray) or base.dtype != np.int32 or base.ndim != 1
            or not prompt.flags.c_contiguous or prompt.ctypes.data != base.ctypes.data):
        return None
    return base


class SentContexts:
    """Client side: what each session last had answered, and by which replica.

    A read-only prompt that starts its base array (TokenBuffer's views) is remembered by a weak
    reference to that array, trusting its owner never to change ids before the end it handed
    over: nothing is copied, and an episode that ends frees its ids. Any other prompt is copied.
    Entries not used for IDLE_S are dropped (a session whose episode ended)."""

    IDLE_S = 600.0

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._sent: OrderedDict[str, _Sent] = OrderedDict()

    def delta_for(self, replica: str, session_id: str, prompt: np.ndarray) -> pb.PromptDelta | None:
        """A delta for `prompt` on `replica`, or None: send it whole."""
        sent = self._sent.get(session_id)
        if sent is None or sent.replica != replica:
            return None
        n_prompt, n = sent.n_prompt, sent.n_prompt + len(sent.sampled)
        if len(prompt) <= n or n < MIN_DELTA_SAVING:
            return None
        before = sent.prompt()
        if before is None or not (np.array_equal(prompt[:n_prompt], before)
                                  and np.array_equal(prompt[n_prompt:n], sent.sampled)):
            return None
        return pb.PromptDelta(base_request_id=sent.request_id, base_tokens=n,
                              suffix_ids=to_tensor(np.asarray(prompt[n:], np.int32)))

    def answered(self, replica: str, session_id: str, request_id: str, prompt: np.ndarray,
                 sampled: np.ndarray) -> None:
        if not session_id:
            return
        owner = _owner(prompt)
        now = time.monotonic()
        self._sent[session_id] = _Sent(replica, request_id, sampled, len(prompt),
                                       None if owner is None else weakref.ref(owner),
                                       prompt.copy() if owner is None else None, now)
        self._sent.move_to_end(session_id)
        while self._sent and (len(self._sent) > self.max_sessions
                              or now - next(iter(self._sent.values())).at > self.IDLE_S):
            self._sent.popitem(last=False)

    def forget(self, session_id: str) -> None:
        self._sent.pop(session_id, None)
