"""One OpenAI-compatible HTTP server: the transport of `OpenAIPool`'s replicas (t1.inference.client.replicas).

- Requests: `post` sends one JSON body over httpx (an `AsyncClient` per endpoint, with its API key),
  at most `max_concurrency` at once, the whole request bounded by connect + request timeouts, and the
  reply read to at most a byte bound (t1.inference.openai.openai_reply). It returns the reply with the
  weights version the endpoint served when the request went out.
- Retryable: connection errors and timeouts, 5xx, 429 (the endpoint is avoided for its `retry-after`,
  capped by `max_retry_after_s`), and a 200 whose body breaks the API (MalformedReply). Refused at
  once (EndpointRefused), naming the endpoint and the fix: 401/403 (the API key) and other 4xx.
- Weights: `weight_updates: vllm_dev` holds new requests, waits until the endpoint's requests have
  ended, then reloads a folder through vLLM's dev-mode endpoints (t1.inference.openai.openai_weights); a
  failed reload is retryable (the endpoint is skipped and caught up later). The version an endpoint
  serves is the one T1 last loaded on it (v0 at first).
- KV capacity: the configured `kv_budget_tokens`.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import time
from dataclasses import dataclass
from typing import Any

import httpx

from t1.config.inference import OpenAIEndpointConfig
from t1.inference.client.replicas import Failure
from t1.inference.openai.openai_reply import error_text, read_bounded
from t1.inference.openai.openai_weights import reload_weights
from t1.inference.openai.openai_wire import EndpointRefused, MalformedReply

_SNIPPET = 300  # characters of an error body quoted in messages
_DRAIN_POLL_S = 0.01


class _Retryable(Exception):
    def __init__(self, why: str, wait_s: float = 0.0) -> None:
        super().__init__(why)
        self.wait_s = wait_s


@dataclass(frozen=True, slots=True)
class Reply:
    """A 2xx reply's body, and the weights version the endpoint served when the request went out."""

    body: bytes
    version: int


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


class HttpTransport:
    """One endpoint's client, slots, weights version and reload gate (`transport`: httpx's, e.g. a MockTransport)."""

    def __init__(self, cfg: OpenAIEndpointConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.cfg = cfg
        self.client = _client(cfg, transport)
        self.version = 0  # the weights version T1 last loaded on it
        self._slots = asyncio.Semaphore(cfg.max_concurrency)
        self._open = asyncio.Event()  # cleared while its weights are reloaded
        self._open.set()
        self._in_flight = 0  # requests sent and not yet answered: a reload waits for them

    @property
    def address(self) -> str:
        return self.cfg.base_url

    def failure(self, error: Exception) -> Failure | None:
        if isinstance(error, _Retryable):
            return Failure(str(error), error.wait_s)
        if isinstance(error, MalformedReply):
            return Failure(str(error))
        return None

    async def post(self, path: str, body: dict[str, Any], limit: int) -> Reply:
        """One POST: its reply (at most `limit` bytes, else MalformedReply); a retryable failure or EndpointRefused."""
        await self._open.wait()
        self._in_flight += 1
        version = self.version  # a reload waits for this request to end
        where = f"{self.cfg.base_url}{path}"
        try:
            async with self._slots:
                # httpx bounds each read; this bounds the whole request (connecting, sending, the reply).
                async with asyncio.timeout(self.cfg.connect_timeout_s + self.cfg.request_timeout_s):
                    async with self.client.stream("POST", path, json=body) as reply:
                        code = reply.status_code
                        if code < 400:
                            return Reply(await read_bounded(reply, limit), version)
                        text = await error_text(reply)
        except (httpx.TimeoutException, TimeoutError) as exc:
            raise _Retryable(f"timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._in_flight -= 1
        if code == 429:
            wait = retry_after_s(reply.headers.get("retry-after"), self.cfg.max_retry_after_s)
            raise _Retryable(f"429 rate limited (retry-after {wait:g}s)", wait)
        if code >= 500:
            raise _Retryable(f"{code}: {text[:_SNIPPET]}")
        if code in (401, 403):
            key = (f"the API key in ${self.cfg.api_key_env} was refused" if self.cfg.api_key_env
                   else "no API key was sent: set api_key_env to the variable that holds it")
            raise EndpointRefused(f"{where}: {code}: {key} ({text[:_SNIPPET]})")
        raise EndpointRefused(f"{where}: {code}: {text[:_SNIPPET]}")

    async def capacity(self) -> tuple[int, int] | None:
        return self.cfg.kv_budget_tokens, 0

    async def served_version(self) -> int:
        return self.version

    async def load_weights(self, path: str, version: int, timeout_s: float) -> int:
        """Hold new requests, wait for the endpoint's requests to end, reload `path` on it as `version`."""
        if self.version >= version:
            return self.version
        self._open.clear()
        try:
            async with asyncio.timeout(timeout_s):
                while self._in_flight:
                    await asyncio.sleep(_DRAIN_POLL_S)
                await reload_weights(self.client, self.cfg.base_url, path, version, timeout_s,
                                     self.cfg.t1_worker_extension)
            self.version = version
        except EndpointRefused as exc:
            raise _Retryable(f"weights v{version}: {exc}") from exc
        finally:
            self._open.set()
        return version

    async def close(self) -> None:
        await self.client.aclose()
