"""ReplicaSet: the replicas of an inference pool and the rules that hold whatever carries their requests.

Both pools are a replica set over a `Transport`, one per replica: `InferencePool` over T1's gRPC
servers (t1.inference.client.grpc_transport), `OpenAIPool` over OpenAI-compatible HTTP servers
(t1.inference.openai.openai_transport). A transport carries one replica's requests and weight loads, and
says which of its errors a retry may fix; everything below is the set's:

- Health: a replica whose attempt fails with a retryable error is avoided for `unhealthy_s` (or as
  long as the transport's failure asks, e.g. an HTTP 429's retry-after) and its version is forgotten:
  it may come back restarted, on the base model. A success does not end the avoidance early.
- Affinity (t1.inference.client.affinity): a session sticks to its replica while that replica is healthy;
  new sessions go to the healthy replica with the fewest requests outstanding. A session moved to
  another replica (a failover) is counted and logged.
- KV admission (`kv_admission`, t1.inference.client.kv_admission): a turn that declares what it needs starts
  only on a replica with room for it (capacity as the transport reports it), waiting otherwise.
- Retries (`_request`): an attempt runs on the session's replica; a retryable failure avoids that
  replica and tries again after `backoff_s * 2**attempt` (at least the failure's wait when no replica is
  healthy), where the session is placed then. Past `retries` the set's `Unavailable` error names the
  last cause; other errors propagate at once.
- Weights: `update_weights` loads a version on the healthy replicas, skips the avoided ones (and those
  whose load fails retryably) and fails only when none loaded it. The set remembers the latest
  (path, version): a replica whose version is unknown or behind is asked its version and brought up to
  the latest before anything is routed to it (a catch-up), one load at a time per replica. Every
  result carries the version that sampled it; one older than its replica was known to serve (it
  restarted unnoticed) makes the set ask that replica again before its next request.
- Metrics: PoolMetrics (t1.inference.client.pool_common), the same names for both transports.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

from prometheus_client import CollectorRegistry

from t1.config.inference import InferencePoolConfig
from t1.inference.client.affinity import MAX_AFFINITY_ENTRIES, Affinity
from t1.inference.client.kv_admission import KvAdmission
from t1.inference.client.pool_common import InferenceUnavailable, PoolMetrics, WeightsUpdate
from t1.inference.types import GenerateResult

log = logging.getLogger(__name__)
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Failure:
    """A transport's verdict on an error a retry elsewhere may fix: why, and how long to avoid the replica."""

    why: str
    wait_s: float = 0.0


class Transport(Protocol):
    """One replica as a transport reaches it. Each transport also has its own send (gRPC: `transmit` of a
    GenerateRequest message; HTTP: `post` of a body), which the pool built on it calls through `_send`."""

    @property
    def address(self) -> str: ...

    def failure(self, error: Exception) -> Failure | None:
        """The error as a retryable failure of this replica; None: a retry would not help, it propagates."""
        ...

    async def capacity(self) -> tuple[int, int] | None:
        """(KV capacity in tokens, the model's context limit), 0 for unknown; None: not answered now."""
        ...

    async def served_version(self) -> int:
        """The policy version the replica serves now (asked where the server can be asked)."""
        ...

    async def load_weights(self, path: str, version: int, timeout_s: float) -> int:
        """Make the replica serve `version` (from the folder `path`); the version it serves then.
        TimeoutError or a retryable failure: it did not, and is skipped."""
        ...

    async def close(self) -> None: ...


T = TypeVar("T", bound=Transport)


@dataclass(slots=True, eq=False)
class Replica(Generic[T]):
    """One replica as the set sees it: its transport, load, health and the version it is known to serve."""

    transport: T
    outstanding: int = 0
    unhealthy_until: float = 0.0
    version: int | None = None  # the policy version it is known to serve; None: ask before routing to it
    sync_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one weight load at a time per replica
    aborts: set[asyncio.Future[Any]] = field(default_factory=set)  # in-flight sends, cancelled when it stalls
    healthy_gauge: Any = None  # its labelled metric child, looked up once
    shown_healthy: bool = True

    @property
    def address(self) -> str:
        return self.transport.address

    def healthy(self, now: float) -> bool:
        return now >= self.unhealthy_until


class ReplicaSet(Generic[T]):
    """Replicas over one kind of transport, with health, affinity, KV admission, retries and weight catch-up."""

    Unavailable: ClassVar[type[InferenceUnavailable]] = InferenceUnavailable  # raised past the retries
    noun: ClassVar[str] = "replica"  # what the set's messages call a replica

    def __init__(self, cfg: InferencePoolConfig, transports: Sequence[T],
                 registry: CollectorRegistry | None = None) -> None:
        self.retries, self.backoff_s, self.unhealthy_s = cfg.retries, cfg.backoff_s, cfg.unhealthy_s
        self.weights_timeout_s = cfg.weights_timeout_s
        self._replicas = [Replica(t) for t in transports]
        self._weights: tuple[str, int] | None = None  # the latest (path, version) update_weights was told
        self._affinity = Affinity(MAX_AFFINITY_ENTRIES)
        self._kv = KvAdmission(len(self._replicas), cfg.kv_expected_context_tokens) if cfg.kv_admission else None
        self.metrics = PoolMetrics(registry)
        for r in self._replicas:
            r.healthy_gauge = self.metrics.healthy.labels(r.address)
            r.healthy_gauge.set(1)
            # Read when scraped: no gauge update on each request's start and end.
            self.metrics.outstanding.labels(r.address).set_function(functools.partial(getattr, r, "outstanding"))

    @property
    def endpoints(self) -> list[str]:
        return [r.address for r in self._replicas]

    @property
    def healthy_endpoints(self) -> list[str]:
        """The replicas not avoided now (RunStatus.healthy_inference_servers counts these)."""
        now = time.monotonic()
        return [r.address for r in self._replicas if r.healthy(now)]

    @property
    def latest_weights(self) -> tuple[str, int] | None:
        """The latest (path, version) update_weights was told; replicas are brought up to it."""
        return self._weights

    def replica_of(self, session_id: str) -> str | None:
        idx = self._affinity.get(session_id)
        return None if idx is None else self._replicas[idx].address

    def end_session(self, session_id: str) -> None:
        self._affinity.forget(session_id)
        if self._kv is not None:
            self._kv.end(session_id)

    def kv_usage(self) -> dict[str, tuple[int, int]]:
        """Per replica (capacity, held) in tokens by the set's ledger; empty without KV admission."""
        if self._kv is None:
            return {}
        return {r.address: self._kv.usage(i) for i, r in enumerate(self._replicas)}

    def _pick(self, session_id: str) -> int:
        return self._affinity.pick(session_id, self._replicas)

    def _bind(self, session_id: str, idx: int) -> None:
        previous = self._affinity.bind(session_id, idx)
        if previous is not None:
            self.metrics.failovers.inc()
            log.info("session %s moved from %s to %s", session_id, self._replicas[previous].address,
                     self._replicas[idx].address)

    async def _request(self, session_id: str, what: str, attempt: Callable[[Replica[T]], Awaitable[R]],
                       need: int | None = None, context: Callable[[R], int] | None = None) -> R:
        """`attempt(replica)` on the session's replica, retried and failed over (the module docstring). With KV
        admission a turn needing `need` tokens waits for room, and the session then holds `context(result)`."""
        last: tuple[str, Exception] | None = None
        for n in range(self.retries + 1):
            idx = held = await self._place(session_id, need)
            replica = self._replicas[idx]
            self._bind(session_id, idx)
            result: R | None = None
            try:
                while not await self._catch_up(replica):  # it failed while this request waited for it
                    idx = self._pick(session_id)
                    replica = self._replicas[idx]
                    self._bind(session_id, idx)
                known = replica.version  # at dispatch: an update during the request is not a restart
                result = await attempt(replica)
            except Exception as exc:
                failure = replica.transport.failure(exc)
                if failure is None:
                    raise
                last = (f"{replica.address}: {failure.why}", exc)
                self._mark_unhealthy(replica, failure.wait_s)
                log.warning("%s on %s failed (%s), attempt %d of %d", what, replica.address, failure.why, n + 1,
                            self.retries + 1)
                if n < self.retries:
                    self.metrics.retries.inc()
                    others = any(r.healthy(time.monotonic()) for r in self._replicas)
                    await asyncio.sleep(max(self.backoff_s * 2**n, 0.0 if others else failure.wait_s))
                continue
            finally:
                if self._kv is not None and need is not None:  # the session now holds its context there, or nothing
                    self._kv.finish(held, session_id, None if result is None or context is None else context(result))
            if not replica.shown_healthy:  # the gauge changes only when the state does
                replica.shown_healthy = True
                replica.healthy_gauge.set(1)
            if isinstance(result, GenerateResult) and known is not None and result.policy_version < known:
                log.warning("%s served v%d, it had v%d: restarted; checking it before its next request",
                            replica.address, result.policy_version, known)
                replica.version = None
            return cast(R, result)
        assert last is not None
        raise self.Unavailable(f"{what} failed on every attempt ({self.retries + 1}); last: {last[0]}") from last[1]

    async def _send(self, replica: Replica[T], sending: Awaitable[R]) -> R:
        """One request's send on its replica (the transport's own call), counted as outstanding there."""
        replica.outstanding += 1  # counted at once: the next request's placement sees it
        try:
            return await sending
        finally:
            replica.outstanding -= 1

    async def _place(self, session_id: str, need: int | None) -> int:
        """The replica for the next attempt: the session's (or the least loaded) one, or with KV admission and a
        `need` in tokens one with room for it, waited for (t1.inference.client.kv_admission)."""
        if self._kv is None or need is None:
            return self._pick(session_id)
        kv = self._kv
        unknown = [i for i in range(len(self._replicas)) if not kv.known(i)]
        if unknown:
            await asyncio.gather(*(self._ask_capacity(i) for i in unknown))
        idx, waited_s = await kv.admit(session_id, need, lambda: self._pick(session_id), self._replicas)
        self.metrics.kv_waited(waited_s)
        return idx

    async def _ask_capacity(self, idx: int) -> None:
        """Learn a replica's KV capacity (one that does not answer stays unknown, asked again next time)."""
        assert self._kv is not None
        capacity = await self._replicas[idx].transport.capacity()
        if capacity is not None:
            self._kv.set_capacity(idx, *capacity)

    def _mark_unhealthy(self, replica: Replica[T], wait_s: float = 0.0) -> None:
        replica.unhealthy_until = time.monotonic() + max(wait_s, self.unhealthy_s)
        replica.shown_healthy = False
        replica.version = None  # it may come back restarted, on the base model
        replica.healthy_gauge.set(0)

    def _current(self, replica: Replica[T]) -> bool:
        """Whether the replica is known to serve the latest weights (or there are none to serve)."""
        return self._weights is None or (replica.version is not None and replica.version >= self._weights[1])

    async def _catch_up(self, replica: Replica[T]) -> bool:
        """Bring a replica of unknown or older version up to the latest weights before it serves anything.

        False when the replica was marked unhealthy while this call waited for another's check, or when it
        did not come up to the latest in time (it is then avoided).
        """
        if self._current(replica):
            return True
        was_healthy = replica.healthy(time.monotonic())
        async with replica.sync_lock:
            if was_healthy and not replica.healthy(time.monotonic()):
                return False
            if self._current(replica):
                return True  # another request caught it up meanwhile
            assert self._weights is not None
            path, version = self._weights
            try:
                served = await replica.transport.served_version()
                if served < version:
                    log.info("%s serves v%d, behind v%d: loading %s before routing to it", replica.address, served,
                             version, path)
                    served = await replica.transport.load_weights(path, version, self.weights_timeout_s)
                    self.metrics.catch_ups.inc()
            except TimeoutError as exc:
                log.warning("%s: %s; avoided for now", replica.address, exc)
                self._mark_unhealthy(replica)
                return False
            replica.version = served
        return True

    async def update_weights(self, path: str, version: int, timeout_s: float | None = None) -> WeightsUpdate:
        """Make the healthy replicas serve a version; the avoided ones catch up when they come back.

        A replica whose load fails retryably (or runs out of time) is avoided and skipped; other errors
        propagate (and the set forgets this version: recovering replicas must not load a folder a server
        refused). Raises the set's Unavailable error when no replica loaded the version.
        """
        previous = self._weights
        if previous is None or version >= previous[1]:
            self._weights = (path, version)
        now = time.monotonic()
        targets = [r for r in self._replicas if r.healthy(now)]
        skipped = [r.address for r in self._replicas if not r.healthy(now)]
        results = await asyncio.gather(*(self._load(r, path, version, timeout_s or self.weights_timeout_s)
                                         for r in targets), return_exceptions=True)
        updated = []
        for replica, res in zip(targets, results, strict=True):
            failure = replica.transport.failure(res) if isinstance(res, Exception) else None
            if failure is not None or isinstance(res, TimeoutError):
                log.warning("weights v%d on %s failed (%s); it catches up when it is back", version, replica.address,
                            failure.why if failure is not None else res)
                self._mark_unhealthy(replica)
                skipped.append(replica.address)
            elif isinstance(res, BaseException):
                if self._weights == (path, version):
                    self._weights = previous
                raise res
            else:
                updated.append(replica.address)
        self.metrics.weight_skips.inc(len(skipped))
        if not updated:
            raise self.Unavailable(f"no {self.noun} loaded weights v{version}; skipped {skipped}")
        return WeightsUpdate(version, tuple(updated), tuple(skipped))

    async def _load(self, replica: Replica[T], path: str, version: int, timeout_s: float) -> None:
        async with replica.sync_lock:
            replica.version = await replica.transport.load_weights(path, version, timeout_s)

    async def close(self) -> None:
        await asyncio.gather(*(r.transport.close() for r in self._replicas))
