"""OpenAIPool: the inference pool over OpenAI-compatible servers (vLLM's, SGLang's, hosted APIs).

A replica set (t1.inference.client.replicas: health, affinity, KV admission, retries, failover, weight
catch-up, metrics) over HTTP transports (t1.inference.openai.openai_transport), the same contract as
InferencePool (t1.inference.client.pool):

- Session affinity: a session sticks to the endpoint that served it while it is healthy (its prefix
  cache holds the session's context); new sessions go to the healthy endpoint with the fewest
  requests outstanding. Each endpoint takes at most `max_concurrency` requests at once.
- Retried, with exponential backoff, on another endpoint where one is healthy: connection errors and
  timeouts, 5xx, 429 (the endpoint is avoided for its `retry-after`), and a 200 whose body breaks the
  API (MalformedReply). Past the retries: EndpointUnavailable.
- Bounded: a reply is streamed and refused (MalformedReply) past a byte bound derived from the
  request's max_tokens, and parsed in a worker thread when large (t1.inference.openai.openai_reply); more
  sampled ids than max_tokens is malformed too.
- Refused at once, with an error that names the endpoint and the fix: 401/403 (the API key), other
  4xx, and a completions server that returns no token ids (NoTokenIds). The episode counts each of
  these as an inference failure (infra_error), never as a reward.
- Token level (`api: completions`, a GenerateFn): the exact context goes as token ids; the result
  carries the server's sampled ids and logprobs and, where it returns them, routed experts for the
  positions after the session's last answered context (checked like T1's own routing blocks).
- Text level (`api: chat`, a ChatGenerateFn): messages in, the reply's text out (tool calls where the
  endpoint takes tools); eval only.
- KV admission (`kv_admission`): an endpoint's capacity is its configured `kv_budget_tokens`, and the
  ledger counts what each session holds there from the prompts it sends and the replies it gets
  (completions; chat requests are not counted).
- Weights: `weight_updates: vllm_dev` drains the endpoint's requests and reloads a weights folder
  through vLLM's dev-mode endpoints (t1.inference.openai.openai_weights); `none` refuses with an error.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import httpx
import numpy as np
from prometheus_client import CollectorRegistry

from t1.config.inference import InferencePoolConfig, OpenAIEndpointConfig
from t1.inference.client.affinity import MAX_AFFINITY_ENTRIES
from t1.inference.client.pool_common import InferenceUnavailable, WeightsUpdate
from t1.inference.client.replicas import Replica, ReplicaSet
from t1.inference.model_config import moe_shape_from_config, read_json
from t1.inference.openai.openai_messages import to_chat_messages
from t1.inference.openai.openai_reply import decode_reply, reply_byte_bound
from t1.inference.openai.openai_transport import HttpTransport
from t1.inference.openai.openai_wire import (
    EndpointRefused,
    NoTokenIds,
    chat_body,
    completion_body,
    parse_chat,
    parse_completion,
)
from t1.inference.routing_capture import MoeShape
from t1.inference.sessions import common_prefix_len
from t1.inference.types import (
    ChatReply,
    ChatRequest,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
)

__all__ = ["EndpointRefused", "EndpointUnavailable", "OpenAIPool"]
log = logging.getLogger(__name__)


class EndpointUnavailable(InferenceUnavailable):
    """Every attempt failed with a retryable error (connection, timeout, 5xx, 429, malformed body)."""


class OpenAIPool(ReplicaSet[HttpTransport]):
    """`await pool(request)` (completions) or `await pool.chat(request)` (chat) on some endpoint, with
    affinity, retries and failover."""

    Unavailable: ClassVar[type[InferenceUnavailable]] = EndpointUnavailable
    noun: ClassVar[str] = "endpoint"

    def __init__(self, cfg: InferencePoolConfig, endpoints: Sequence[OpenAIEndpointConfig] | None = None, *,
                 vocab_size: int | None = None, moe: MoeShape | None = None,
                 registry: CollectorRegistry | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        """Endpoints (default: cfg.openai); `vocab_size` bounds returned ids, `moe` shapes returned routing
        (both from the local copy of the served model, see `from_model`)."""
        eps = list(cfg.openai if endpoints is None else endpoints)
        if not eps:
            raise ValueError("OpenAIPool needs at least one endpoint (inference.pool.openai)")
        if len({e.api for e in eps}) > 1:
            raise ValueError("OpenAIPool: every endpoint uses the same api (completions or chat)")
        self.api = eps[0].api
        super().__init__(cfg, [HttpTransport(e, transport) for e in eps], registry)
        self._vocab = vocab_size or 2**31 - 1
        self._moe = moe
        self._known: OrderedDict[str, np.ndarray] = OrderedDict()  # session -> ids whose routing came back
        self.routing_defects: dict[str, int] = {}

    @classmethod
    def from_model(cls, cfg: InferencePoolConfig, model_dir: Path,
                   endpoints: Sequence[OpenAIEndpointConfig] | None = None, **kw: Any) -> OpenAIPool:
        """A pool whose id bound and routing shape come from the model folder's config.json."""
        model = read_json(Path(model_dir) / "config.json")
        vocab = int(model["vocab_size"]) if "vocab_size" in model else None
        return cls(cfg, endpoints, vocab_size=vocab, moe=moe_shape_from_config(model), **kw)

    @property
    def text_level(self) -> bool:
        """True for chat endpoints: replies are text, their token ids are T1's re-tokenization."""
        return self.api == "chat"

    def end_session(self, session_id: str) -> None:
        super().end_session(session_id)
        self._known.pop(session_id, None)

    async def __call__(self, request: GenerateRequest) -> GenerateResult:
        """One turn over /completions: token ids in, the server's sampled ids, logprobs (and routing) out."""
        if self.text_level:
            raise NoTokenIds(f"{self.endpoints[0]}: a chat endpoint returns text, not token ids (api: chat)")
        t0 = time.perf_counter()
        prompt = np.asarray(request.prompt_ids, np.int32)
        moe = self._moe if request.return_routing else None
        known = self._known.get(request.session_id) if request.session_id and moe is not None else None
        start = 0 if known is None else min(common_prefix_len(known, prompt), len(prompt) - 1)

        async def attempt(replica: Replica[HttpTransport]) -> GenerateResult:
            ep = replica.transport
            max_tokens = request.sampling.max_tokens
            limit = reply_byte_bound(max_tokens, len(prompt) - start + max_tokens, moe)
            reply = await self._send(replica, ep.post("/completions", completion_body(ep.cfg.model, request, start),
                                                      limit))
            try:
                result, defects = await decode_reply(reply.body, lambda body: parse_completion(
                    body, len(prompt), reply.version, self._vocab, moe, start, max_tokens))
            except NoTokenIds as exc:
                raise EndpointRefused(f"{ep.address}/completions: {exc}") from None
            if defects is not None and defects.any:
                for name in type(defects).__slots__:
                    self.routing_defects[name] = self.routing_defects.get(name, 0) + int(getattr(defects, name))
                log.warning("routing from %s repaired (bad records marked missing): %s", ep.address, defects)
            return result

        result: GenerateResult = await self._request(
            request.session_id, "/completions", attempt, len(prompt) + request.sampling.max_tokens,
            lambda res: len(prompt) + len(res.token_ids))
        if request.session_id and result.routing is not None:
            self._known[request.session_id] = np.concatenate([prompt, result.token_ids[:-1]])
            self._known.move_to_end(request.session_id)
            while len(self._known) > MAX_AFFINITY_ENTRIES:
                self._known.popitem(last=False)
        self.metrics.observe(result, time.perf_counter() - t0)
        return result

    async def check_token_ids(self) -> None:
        """Before training: one 1-token completion per endpoint; EndpointRefused names an endpoint that returns
        no token ids (or refuses the request). An endpoint that cannot be reached now is left to its retries."""
        probe = GenerateRequest("", np.zeros(1, np.int32), SamplingParams(max_tokens=1))
        for replica in self._replicas:
            ep = replica.transport
            try:
                reply = await ep.post("/completions", completion_body(ep.cfg.model, probe, 0), reply_byte_bound(1))
                await decode_reply(reply.body, functools.partial(parse_completion, prompt_len=1, version=reply.version,
                                                                 vocab_size=self._vocab, moe=None, routing_start=0,
                                                                 max_tokens=1))
            except NoTokenIds as exc:
                raise EndpointRefused(f"{ep.address}: training refused: {exc}") from None
            except Exception as exc:
                if ep.failure(exc) is None:
                    raise
                log.warning("%s: token-id check skipped (%s); its replies are checked as they come", ep.address, exc)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await self(request)

    async def chat(self, request: ChatRequest) -> ChatReply:
        """One turn over /chat/completions: the conversation's messages in, the reply's text out."""
        async def attempt(replica: Replica[HttpTransport]) -> ChatReply:
            ep = replica.transport
            tools = request.tools if ep.cfg.tool_calls else None
            body = chat_body(ep.cfg.model, to_chat_messages(list(request.messages), ep.cfg.tool_calls), tools,
                             request.sampling)
            reply = await self._send(replica, ep.post("/chat/completions", body,
                                                      reply_byte_bound(request.sampling.max_tokens)))
            return await decode_reply(reply.body, parse_chat)

        result: ChatReply = await self._request(request.session_id, "/chat/completions", attempt)
        self.metrics.completion_tokens.inc(result.completion_tokens)
        return result

    async def update_weights(self, path: str, version: int, timeout_s: float | None = None) -> WeightsUpdate:
        """Load a weights folder on the healthy endpoints (t1.inference.openai.openai_weights; the others catch up
        when they are back); refused where an endpoint has `weight_updates: none`."""
        refused = [r.address for r in self._replicas if r.transport.cfg.weight_updates == "none"]
        if refused:
            raise EndpointRefused(f"weights v{version}: {', '.join(refused)} cannot load new weights "
                                  "(weight_updates: none); serve with vLLM's dev mode and set weight_updates: vllm_dev")
        return await super().update_weights(path, version, timeout_s)
