"""OpenAIPool: the inference pool over OpenAI-compatible servers (vLLM's, SGLang's, hosted APIs).

The same contract as InferencePool (t1.inference.pool), over HTTP with httpx:

- Session affinity: a session sticks to the endpoint that served it while it is healthy (its prefix
  cache holds the session's context); new sessions go to the healthy endpoint with the fewest
  requests outstanding. Each endpoint takes at most `max_concurrency` requests at once.
- Retried, with exponential backoff, on another endpoint where one is healthy: connection errors and
  timeouts, 5xx, 429 (the endpoint is avoided for its `retry-after`, capped by `max_retry_after_s`),
  and a 200 whose body breaks the API (MalformedReply). Past the retries: EndpointUnavailable.
- Bounded: a reply is streamed and refused (MalformedReply) past a byte bound derived from the
  request's max_tokens, and parsed in a worker thread when large (t1.inference.openai_reply); more
  sampled ids than max_tokens is malformed too.
- Refused at once, with an error that names the endpoint and the fix: 401/403 (the API key), other
  4xx, and a completions server that returns no token ids (NoTokenIds). The episode counts each of
  these as an inference failure (infra_error), never as a reward.
- Token level (`api: completions`, a GenerateFn): the exact context goes as token ids; the result
  carries the server's sampled ids and logprobs and, where it returns them, routed experts for the
  positions after the session's last answered context (checked like T1's own routing blocks).
- Text level (`api: chat`, a ChatGenerateFn): messages in, the reply's text out (tool calls where the
  endpoint takes tools); eval only.
- KV admission (`kv_admission`, t1.inference.kv_admission): an endpoint's capacity is its configured
  `kv_budget_tokens`, and the pool's ledger counts what each session holds there from the prompts it
  sends and the replies it gets (completions; chat requests are not counted).
- Weights: `weight_updates: vllm_dev` drains the endpoint's requests and reloads a weights folder
  through vLLM's dev-mode endpoints (t1.inference.openai_weights); `none` refuses with an error.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import itertools
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
from prometheus_client import CollectorRegistry

from t1.config.inference import InferencePoolConfig, OpenAIEndpointConfig
from t1.inference.affinity import MAX_AFFINITY_ENTRIES, Affinity
from t1.inference.kv_admission import KvAdmission
from t1.inference.model_config import moe_shape_from_config, read_json
from t1.inference.openai_endpoint import Endpoint, EndpointRefused
from t1.inference.openai_messages import to_chat_messages
from t1.inference.openai_reply import decode_reply, error_text, read_bounded, reply_byte_bound
from t1.inference.openai_weights import reload_endpoint
from t1.inference.openai_wire import (
    MalformedReply,
    NoTokenIds,
    chat_body,
    completion_body,
    parse_chat,
    parse_completion,
)
from t1.inference.pool_common import InferenceUnavailable, PoolMetrics, WeightsUpdate
from t1.inference.routing_capture import MoeShape
from t1.inference.sessions import common_prefix_len
from t1.inference.types import (
    ChatReply,
    ChatRequest,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
_SNIPPET = 300  # characters of an error body quoted in messages


class EndpointUnavailable(InferenceUnavailable):
    """Every attempt failed with a retryable error (connection, timeout, 5xx, 429, malformed body)."""


class _Retryable(Exception):
    def __init__(self, why: str, wait_s: float = 0.0) -> None:
        super().__init__(why)
        self.wait_s = wait_s


def retry_after_s(value: str | None, cap: float) -> float:
    """A retry-after header (seconds or an HTTP date) in seconds, within [0, cap]; 0 when absent or unreadable."""
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return 0.0
    return min(max(seconds, 0.0), cap)


def _client(cfg: OpenAIEndpointConfig, transport: httpx.AsyncBaseTransport | None) -> httpx.AsyncClient:
    headers = {}
    if cfg.api_key_env:
        key = os.environ.get(cfg.api_key_env)
        if not key:
            raise ValueError(f"inference.pool.openai: {cfg.base_url}: environment variable {cfg.api_key_env} "
                             "(api_key_env) is not set")
        headers["Authorization"] = f"Bearer {key}"
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=cfg.connect_timeout_s)
    limits = httpx.Limits(max_connections=cfg.max_concurrency, max_keepalive_connections=cfg.max_concurrency)
    return httpx.AsyncClient(base_url=cfg.base_url, headers=headers, timeout=timeout, limits=limits,
                             transport=transport)


class OpenAIPool:
    """`await pool(request)` (completions) or `await pool.chat(request)` (chat) on some endpoint, with
    affinity, retries and failover."""

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
        self.retries, self.backoff_s, self.unhealthy_s = cfg.retries, cfg.backoff_s, cfg.unhealthy_s
        self.weights_timeout_s = cfg.weights_timeout_s
        self._eps = [Endpoint(e, _client(e, transport), asyncio.Semaphore(e.max_concurrency)) for e in eps]
        for ep in self._eps:
            ep.open.set()
        self._vocab = vocab_size or 2**31 - 1
        self._moe = moe
        self._affinity = Affinity()
        self._known: OrderedDict[str, np.ndarray] = OrderedDict()  # session -> ids whose routing came back
        self._weights: tuple[str, int] | None = None
        self._ids = itertools.count()
        self._kv = KvAdmission(len(self._eps), cfg.kv_expected_context_tokens) if cfg.kv_admission else None
        if self._kv is not None:
            for i, ep in enumerate(self._eps):
                self._kv.set_capacity(i, ep.cfg.kv_budget_tokens)
        self.metrics = PoolMetrics(registry)
        self.routing_defects: dict[str, int] = {}
        for ep in self._eps:
            self.metrics.healthy.labels(ep.cfg.base_url).set(1)

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

    @property
    def endpoints(self) -> list[str]:
        return [e.cfg.base_url for e in self._eps]

    @property
    def healthy_endpoints(self) -> list[str]:
        now = time.monotonic()
        return [e.cfg.base_url for e in self._eps if e.healthy(now)]

    @property
    def latest_weights(self) -> tuple[str, int] | None:
        return self._weights

    def replica_of(self, session_id: str) -> str | None:
        idx = self._affinity.get(session_id)
        return None if idx is None else self._eps[idx].cfg.base_url

    def end_session(self, session_id: str) -> None:
        self._affinity.forget(session_id)
        self._known.pop(session_id, None)
        if self._kv is not None:
            self._kv.end(session_id)

    def kv_usage(self) -> dict[str, tuple[int, int]]:
        """Per endpoint (budget, held) in tokens by the pool's ledger; empty without KV admission."""
        if self._kv is None:
            return {}
        return {e.cfg.base_url: self._kv.usage(i) for i, e in enumerate(self._eps)}

    def _pick(self, session_id: str) -> int:
        return self._affinity.pick(session_id, self._eps)

    def _bind(self, session_id: str, idx: int) -> None:
        if self._affinity.bind(session_id, idx) is not None:
            self.metrics.failovers.inc()

    def _avoid(self, ep: Endpoint, seconds: float) -> None:
        ep.unhealthy_until = time.monotonic() + max(seconds, self.unhealthy_s)
        self.metrics.healthy.labels(ep.cfg.base_url).set(0)

    async def post(self, ep: Endpoint, path: str, body: dict[str, Any], limit: int) -> bytes:
        """One POST; the reply's body (at most `limit` bytes, else MalformedReply), or _Retryable / EndpointRefused."""
        await ep.open.wait()
        ep.outstanding += 1
        where = f"{ep.cfg.base_url}{path}"
        try:
            async with ep.slots:
                # httpx bounds each read; this bounds the whole request (connecting, sending, the reply).
                async with asyncio.timeout(ep.cfg.connect_timeout_s + ep.cfg.request_timeout_s):
                    async with ep.client.stream("POST", path, json=body) as reply:
                        code = reply.status_code
                        if code < 400:
                            return await read_bounded(reply, limit)
                        text = await error_text(reply)
        except (httpx.TimeoutException, TimeoutError) as exc:
            raise _Retryable(f"timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        finally:
            ep.outstanding -= 1
        if code == 429:
            wait = retry_after_s(reply.headers.get("retry-after"), ep.cfg.max_retry_after_s)
            raise _Retryable(f"429 rate limited (retry-after {wait:g}s)", wait)
        if code >= 500:
            raise _Retryable(f"{code}: {text[:_SNIPPET]}")
        if code in (401, 403):
            key = (f"the API key in ${ep.cfg.api_key_env} was refused" if ep.cfg.api_key_env
                   else "no API key was sent: set api_key_env to the variable that holds it")
            raise EndpointRefused(f"{where}: {code}: {key} ({text[:_SNIPPET]})")
        raise EndpointRefused(f"{where}: {code}: {text[:_SNIPPET]}")

    async def _place(self, session_id: str, need: int | None) -> int:
        """The session's endpoint (or the least loaded one); with KV admission and a `need` in tokens, one
        with room for it, waited for (t1.inference.kv_admission)."""
        if self._kv is None or need is None:
            return self._pick(session_id)
        idx, waited_s = await self._kv.admit(session_id, need, lambda: self._pick(session_id), self._eps)
        self.metrics.kv_waited(waited_s)
        return idx

    async def _request(self, session_id: str, path: str, attempt_fn: Callable[[Endpoint], Any],
                       need: int | None = None, context: Callable[[Any], int] | None = None) -> Any:
        """`attempt_fn(endpoint)` (a coroutine) on the session's endpoint, retried and failed over; with KV
        admission a turn needing `need` tokens waits for room, and the session then holds `context(result)`."""
        last = ""
        for attempt in range(self.retries + 1):
            idx = await self._place(session_id, need)
            ep = self._eps[idx]
            self._bind(session_id, idx)
            result = None
            try:
                await self._catch_up(ep)
                result = await attempt_fn(ep)
            except (_Retryable, MalformedReply) as exc:
                wait = exc.wait_s if isinstance(exc, _Retryable) else 0.0
                last = f"{ep.cfg.base_url}{path}: {exc}"
                self._avoid(ep, wait)
                log.warning("%s (attempt %d of %d)", last, attempt + 1, self.retries + 1)
                if attempt < self.retries:
                    self.metrics.retries.inc()
                    others = [e for e in self._eps if e.healthy(time.monotonic())]
                    await asyncio.sleep(max(self.backoff_s * 2**attempt, 0.0 if others else wait))
                continue
            finally:
                if self._kv is not None and need is not None:  # the session now holds its context there, or nothing
                    self._kv.finish(idx, session_id, None if result is None or context is None else context(result))
            if ep.unhealthy_until:
                ep.unhealthy_until = 0.0
                self.metrics.healthy.labels(ep.cfg.base_url).set(1)
            return result
        raise EndpointUnavailable(f"{path} failed on every attempt ({self.retries + 1}); last: {last}")

    async def _catch_up(self, ep: Endpoint) -> None:
        """An endpoint that missed a weight update (it failed during it) loads the latest before serving."""
        if self._weights is None or ep.version >= self._weights[1]:
            return
        path, version = self._weights
        log.info("%s serves v%d, behind v%d: loading %s before routing to it", ep.cfg.base_url, ep.version,
                 version, path)
        try:
            await reload_endpoint(ep, path, version, self.weights_timeout_s)
        except EndpointRefused as exc:
            raise _Retryable(f"catching up to weights v{version}: {exc}") from exc
        self.metrics.catch_ups.inc()

    async def __call__(self, request: GenerateRequest) -> GenerateResult:
        """One turn over /completions: token ids in, the server's sampled ids, logprobs (and routing) out."""
        if self.text_level:
            raise NoTokenIds(f"{self.endpoints[0]}: a chat endpoint returns text, not token ids (api: chat)")
        t0 = time.perf_counter()
        prompt = np.asarray(request.prompt_ids, np.int32)
        moe = self._moe if request.return_routing else None
        known = self._known.get(request.session_id) if request.session_id and moe is not None else None
        start = 0 if known is None else min(common_prefix_len(known, prompt), len(prompt) - 1)

        async def attempt(ep: Endpoint) -> GenerateResult:
            await ep.open.wait()
            version = ep.version  # at dispatch: a reload waits for the endpoint's requests to end
            max_tokens = request.sampling.max_tokens
            limit = reply_byte_bound(max_tokens, len(prompt) - start + max_tokens, moe)
            raw = await self.post(ep, "/completions", completion_body(ep.cfg.model, request, start), limit)
            try:
                result, defects = await decode_reply(raw, lambda body: parse_completion(
                    body, len(prompt), version, self._vocab, moe, start, max_tokens))
            except NoTokenIds as exc:
                raise EndpointRefused(f"{ep.cfg.base_url}/completions: {exc}") from None
            if defects is not None and defects.any:
                for name in type(defects).__slots__:
                    self.routing_defects[name] = self.routing_defects.get(name, 0) + int(getattr(defects, name))
                log.warning("routing from %s repaired (bad records marked missing): %s", ep.cfg.base_url, defects)
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
        for ep in self._eps:
            try:
                raw = await self.post(ep, "/completions", completion_body(ep.cfg.model, probe, 0), reply_byte_bound(1))
                await decode_reply(raw, functools.partial(parse_completion, prompt_len=1, version=ep.version,
                                                          vocab_size=self._vocab, moe=None, routing_start=0,
                                                          max_tokens=1))
            except NoTokenIds as exc:
                raise EndpointRefused(f"{ep.cfg.base_url}: training refused: {exc}") from None
            except (_Retryable, MalformedReply) as exc:
                log.warning("%s: token-id check skipped (%s); its replies are checked as they come", ep.cfg.base_url,
                            exc)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await self(request)

    async def chat(self, request: ChatRequest) -> ChatReply:
        """One turn over /chat/completions: the conversation's messages in, the reply's text out."""
        async def attempt(ep: Endpoint) -> ChatReply:
            tools = request.tools if ep.cfg.tool_calls else None
            body = chat_body(ep.cfg.model, to_chat_messages(list(request.messages), ep.cfg.tool_calls), tools,
                             request.sampling)
            limit = reply_byte_bound(request.sampling.max_tokens)
            raw = await self.post(ep, "/chat/completions", body, limit)
            return await decode_reply(raw, parse_chat)

        reply: ChatReply = await self._request(request.session_id, "/chat/completions", attempt)
        self.metrics.completion_tokens.inc(reply.completion_tokens)
        return reply

    async def update_weights(self, path: str, version: int, timeout_s: float | None = None) -> WeightsUpdate:
        """Load a weights folder on every endpoint (t1.inference.openai_weights); refused where an endpoint
        has `weight_updates: none`."""
        refused = [e.cfg.base_url for e in self._eps if e.cfg.weight_updates == "none"]
        if refused:
            raise EndpointRefused(f"weights v{version}: {', '.join(refused)} cannot load new weights "
                                  "(weight_updates: none); serve with vLLM's dev mode and set weight_updates: vllm_dev")
        self._weights = (path, version)
        results = await asyncio.gather(*(reload_endpoint(e, path, version, timeout_s or self.weights_timeout_s)
                                         for e in self._eps), return_exceptions=True)
        updated, skipped = [], []
        for ep, res in zip(self._eps, results, strict=True):
            if isinstance(res, BaseException):
                log.warning("weights v%d on %s failed: %s; it is avoided until it is caught up", version,
                            ep.cfg.base_url, res)
                self._avoid(ep, self.unhealthy_s)
                skipped.append(ep.cfg.base_url)
            else:
                updated.append(ep.cfg.base_url)
        self.metrics.weight_skips.inc(len(skipped))
        if not updated:
            raise EndpointUnavailable(f"no endpoint loaded weights v{version}; failed: {skipped}")
        return WeightsUpdate(version, tuple(updated), tuple(skipped))

    async def close(self) -> None:
        await asyncio.gather(*(e.client.aclose() for e in self._eps))
