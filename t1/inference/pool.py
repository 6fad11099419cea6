"""InferencePool: the client side of InferenceService over several replicas; a GenerateFn.

- Session affinity: a session sticks to the replica that served it while that replica is healthy
  (its KV cache holds the session's prefix there).
- New sessions go to the healthy replica with the fewest outstanding requests.
- UNAVAILABLE and DEADLINE_EXCEEDED are retried with exponential backoff; the failed replica is
  avoided for `unhealthy_s`. A session whose replica failed moves to another one and sends its
  whole context there, so the new replica simply prefills it (a failover). A failed attempt's
  partial tokens are discarded; with a request seed the retry samples the same tokens.
- Prompt deltas (t1.inference.prompt_delta): a session's request that continues the context its
  replica last answered sends only the new ids; a replica that lost that context is sent the whole
  prompt, and one that predates deltas gets whole prompts from then on.
- Every call has a deadline (`request_timeout_s`); other errors (INVALID_ARGUMENT, ...) propagate.
- Transport: by default every replica gets one long-lived GenerateBatched stream that carries all
  of its requests (t1.inference.multiplex): far less CPU per turn than a Generate call each. A
  broken stream fails its requests with UNAVAILABLE (retried as above); a server without
  GenerateBatched (UNIMPLEMENTED) is served one Generate call per request from then on.
- Weights: `update_weights` loads the new version on the healthy replicas and skips the avoided ones
  (it fails only when no replica loaded it); with `weights: follow` the servers load versions
  themselves (t1.inference.follow) and it waits until they serve it instead. The pool remembers the latest (path,
  version); a
  replica whose state is unknown (new, or failed since) is asked its version before anything is
  routed to it and brought up to the latest first, so a restarted server (which starts on the base
  model) never serves a stale policy. A result from an older version than the replica was known to
  serve (it restarted unnoticed) makes the pool check that replica again before its next request.
- Stalls (t1.inference.stall, driven by t1.inference.stall_guard): a busy replica that makes no progress for `stall_s`
(or loads weights
  past `weights_timeout_s`) is avoided and its in-flight requests fail with UNAVAILABLE, so they
  are retried elsewhere (a failover). `stalls` keeps the verdicts.
- KV admission (`kv_admission`, t1.inference.kv_admission): a new episode starts only on a replica
  with room in its reported KV capacity for what it is expected to grow to; otherwise it waits.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from prometheus_client import CollectorRegistry

from t1.config.inference import InferencePoolConfig, WeightsMode
from t1.config.service import AuthConfig
from t1.inference.affinity import MAX_AFFINITY_ENTRIES, Affinity
from t1.inference.convert import (
    event_from_proto,
    info_from_proto,
    request_to_proto,
    result_from_proto,
)
from t1.inference.follow import await_served
from t1.inference.kv_admission import KvAdmission
from t1.inference.multiplex import BatchedStream
from t1.inference.pool_common import InferenceUnavailable, PoolMetrics, WeightsUpdate
from t1.inference.prompt_delta import SentContexts
from t1.inference.stall import Stall, StallWatch
from t1.inference.stall_guard import StallGuard
from t1.inference.types import GenerateRequest, GenerateResult, ModelInfo, collect
from t1.rpc.client import call_options, make_channel
from t1.v1 import inference_pb2 as pb
from t1.v1 import inference_pb2_grpc

log = logging.getLogger(__name__)
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


@dataclass(slots=True)
class _Replica:
    address: str
    channel: grpc.aio.Channel
    stub: inference_pb2_grpc.InferenceServiceStub
    outstanding: int = 0
    unhealthy_until: float = 0.0
    version: int | None = None  # the policy version it is known to serve; None: ask before routing to it
    sync_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one weight load at a time per replica
    stream: BatchedStream | None = None  # None: one Generate call per request
    deltas: bool = True  # takes prompt deltas (False once it answered one as a server without them)
    aborts: set[asyncio.Future[None]] = field(default_factory=set)  # in-flight sends, failed when it stalls
    # Its labelled metric children, looked up once (a labels() call per request is measurable).
    healthy_gauge: Any = None
    shown_healthy: bool = True

    def healthy(self, now: float) -> bool:
        return now >= self.unhealthy_until


class InferencePool:
    """`await pool(request)` generates one turn on some replica, with affinity, retries and failover."""

    def __init__(self, cfg: InferencePoolConfig, endpoints: Sequence[str] | None = None, *,
                 auth: AuthConfig | None = None, registry: CollectorRegistry | None = None) -> None:
        """Replicas at `endpoints` (default: cfg.endpoints); every limit and switch comes from `cfg`."""
        endpoints = list(cfg.endpoints if endpoints is None else endpoints)
        if not endpoints:
            raise ValueError("InferencePool needs at least one endpoint (inference.pool.endpoints)")
        self._auth = auth or AuthConfig()
        self._opts = call_options(self._auth, cfg.request_timeout_s)
        self.retries, self.backoff_s, self.unhealthy_s = cfg.retries, cfg.backoff_s, cfg.unhealthy_s
        self.weights_timeout_s, self.probe_timeout_s = cfg.weights_timeout_s, cfg.probe_timeout_s
        self._timeout_s = cfg.request_timeout_s
        self._batched, self._linger_s = cfg.batched_stream, cfg.batch_linger_ms / 1e3
        self._follow = cfg.weights == WeightsMode.FOLLOW  # the servers load versions themselves
        self._weights: tuple[str, int] | None = None  # the latest (path, version) update_weights was told
        self._replicas = [self._connect(a) for a in endpoints]
        self._affinity = Affinity(MAX_AFFINITY_ENTRIES)
        self._sent = SentContexts(MAX_AFFINITY_ENTRIES)
        self._deltas = cfg.prompt_deltas
        self._ids = itertools.count()
        self._probe_s = min(self.probe_timeout_s, cfg.stall_check_s * 4)
        self._guard = StallGuard(StallWatch(cfg.stall_s, cfg.weights_timeout_s), cfg.stall_check_s, self._replicas,
                                 self._progress, self._stalled) if cfg.stall_s > 0 else None
        self.stalls: list[Stall] = []  # the verdicts, oldest first
        self._kv = KvAdmission(len(self._replicas), cfg.kv_expected_context_tokens) if cfg.kv_admission else None
        self.metrics = PoolMetrics(registry)
        for r in self._replicas:
            r.healthy_gauge = self.metrics.healthy.labels(r.address)
            r.healthy_gauge.set(1)
            # Read when scraped: no gauge update on each request's start and end.
            self.metrics.outstanding.labels(r.address).set_function(functools.partial(getattr, r, "outstanding"))

    def _connect(self, address: str) -> _Replica:
        channel = make_channel(address, self._auth)
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        stream = BatchedStream(stub, address, self._opts.metadata, self._linger_s) if self._batched else None
        return _Replica(address, channel, stub, stream=stream)

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

    def stream_stats(self) -> dict[str, int]:
        """GenerateBatched packing over replicas: messages and requests sent, messages and results received
        (sums), and the most results one reply message carried (the largest)."""
        total: dict[str, int] = {}
        for r in self._replicas:
            for key, value in (r.stream.stats.items() if r.stream is not None else ()):
                total[key] = max(total.get(key, 0), value) if key.startswith("most_") else total.get(key, 0) + value
        return total

    def replica_of(self, session_id: str) -> str | None:
        idx = self._affinity.get(session_id)
        return None if idx is None else self._replicas[idx].address

    def end_session(self, session_id: str) -> None:
        self._affinity.forget(session_id)
        self._sent.forget(session_id)
        if self._kv is not None:
            self._kv.end(session_id)

    def _pick(self, session_id: str) -> int:
        return self._affinity.pick(session_id, self._replicas)

    def _bind(self, session_id: str, idx: int) -> None:
        previous = self._affinity.bind(session_id, idx)
        if previous is not None:
            self.metrics.failovers.inc()
            log.info("session %s moved from %s to %s", session_id, self._replicas[previous].address,
                     self._replicas[idx].address)

    async def __call__(self, request: GenerateRequest) -> GenerateResult:
        t0 = time.perf_counter()
        last_error: grpc.aio.AioRpcError | None = None
        for attempt in range(self.retries + 1):
            idx = held = await self._place(request)
            replica = self._replicas[idx]
            self._bind(request.session_id, idx)
            result = None
            try:
                while not await self._catch_up(replica):  # it failed while this request waited for it
                    idx = self._pick(request.session_id)
                    replica = self._replicas[idx]
                    self._bind(request.session_id, idx)
                known = replica.version  # at dispatch: an update during the request is not a restart
                result = await self._attempt(replica, request)
            except grpc.aio.AioRpcError as err:
                if err.code() not in RETRYABLE:
                    raise
                last_error = err
                self._mark_unhealthy(replica)
                log.warning("generate on %s failed (%s: %s), attempt %d of %d", replica.address,
                            err.code().name, err.details(), attempt + 1, self.retries + 1)
                if attempt < self.retries:
                    self.metrics.retries.inc()
                    await asyncio.sleep(self.backoff_s * 2**attempt)
                continue
            finally:
                if self._kv is not None:  # the session now holds its context there, or nothing
                    self._kv.finish(held, request.session_id, None if result is None else
                                    len(request.prompt_ids) + len(result.token_ids))
            if not replica.shown_healthy:  # the gauge changes only when the state does
                replica.shown_healthy = True
                replica.healthy_gauge.set(1)
            if known is not None and result.policy_version < known:
                log.warning("%s served v%d, it had v%d: restarted; checking it before its next request",
                            replica.address, result.policy_version, known)
                replica.version = None
            self.metrics.observe(result, time.perf_counter() - t0)
            return result
        assert last_error is not None
        raise InferenceUnavailable(f"generate failed on every attempt ({self.retries + 1}): "
                                   f"{last_error.code().name}: {last_error.details()}") from last_error

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await self(request)

    async def _place(self, request: GenerateRequest) -> int:
        """The replica for the request's next attempt: its session's (or the least loaded) one, or with
        KV admission (t1.inference.kv_admission) one with room for its context, waited for."""
        if self._kv is None:
            return self._pick(request.session_id)
        kv, session = self._kv, request.session_id
        unknown = [i for i in range(len(self._replicas)) if not kv.known(i)]
        if unknown:
            await asyncio.gather(*(self._ask_capacity(i) for i in unknown))
        need = len(request.prompt_ids) + request.sampling.max_tokens
        idx, waited_s = await kv.admit(session, need, lambda: self._pick(session), self._replicas)
        self.metrics.kv_waited(waited_s)
        return idx

    async def _ask_capacity(self, idx: int) -> None:
        """Learn a replica's KV capacity (an unanswered probe leaves it unknown, asked again next time)."""
        assert self._kv is not None
        replica = self._replicas[idx]
        try:
            info = await replica.stub.GetModelInfo(pb.GetModelInfoRequest(), **self._opts.kw(self.probe_timeout_s))
        except grpc.aio.AioRpcError as err:
            log.warning("%s: no KV capacity (%s); admitted without a bound until it answers", replica.address,
                        err.code().name)
            return
        self._kv.set_capacity(idx, int(info.kv_capacity_tokens), int(info.max_context_tokens))

    def kv_usage(self) -> dict[str, tuple[int, int]]:
        """Per replica (capacity, held) in tokens by the pool's ledger; empty without KV admission."""
        if self._kv is None:
            return {}
        return {r.address: self._kv.usage(i) for i, r in enumerate(self._replicas)}

    def _mark_unhealthy(self, replica: _Replica) -> None:
        replica.unhealthy_until = time.monotonic() + self.unhealthy_s
        replica.shown_healthy = False
        replica.version = None  # it may come back restarted, on the base model
        replica.healthy_gauge.set(0)

    async def _catch_up(self, replica: _Replica) -> bool:
        """Bring a replica of unknown version up to the latest weights before it serves anything.

        False when the replica was marked unhealthy while this call waited for another's check.
        """
        if self._weights is None or replica.version is not None:
            return True
        was_healthy = replica.healthy(time.monotonic())
        async with replica.sync_lock:
            if was_healthy and not replica.healthy(time.monotonic()):
                return False
            if replica.version is not None or self._weights is None:
                return True  # another request caught it up meanwhile
            path, version = self._weights
            if self._follow:  # it loads versions itself: wait until it serves this one
                try:
                    replica.version = await await_served(replica.stub, version, self.weights_timeout_s,
                                                         self._opts.kw, min(self.probe_timeout_s, self._timeout_s))
                except TimeoutError as exc:
                    log.warning("%s: %s; avoided for now", replica.address, exc)
                    self._mark_unhealthy(replica)
                    return False
                return True
            # wait_for_ready: a channel whose server died stays failed until a call asks it to reconnect.
            info = await replica.stub.GetModelInfo(pb.GetModelInfoRequest(), wait_for_ready=True,
                                                   **self._opts.kw(min(self.probe_timeout_s, self._timeout_s)))
            served = int(info.policy_version)
            if served < version:
                log.info("%s serves v%d, behind v%d: loading %s before routing to it", replica.address, served,
                         version, path)
                reply = await replica.stub.UpdateWeights(pb.UpdateWeightsRequest(path=path, version=version),
                                                         **self._opts.kw(self.weights_timeout_s))
                served = int(reply.policy_version)
                self.metrics.catch_ups.inc()
            replica.version = served
        return True

    async def _attempt(self, replica: _Replica, request: GenerateRequest) -> GenerateResult:
        """One request on one replica: as a prompt delta where the replica holds the session's last
        context (resent whole if it no longer does), else whole."""
        request_id = f"req-{next(self._ids)}"
        prompt = np.asarray(request.prompt_ids, np.int32)
        delta = (self._sent.delta_for(replica.address, request.session_id, prompt)
                 if self._deltas and replica.deltas else None)
        try:
            if delta is None:
                result = await self._send(replica, request_to_proto(request, request_id))
            else:
                self.metrics.prompt_deltas.inc()
                try:
                    result = await self._send(replica, request_to_proto(request, request_id, delta))
                except grpc.aio.AioRpcError as err:
                    if err.code() not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                        raise
                    self.metrics.prompt_resends.inc()
                    result = await self._send(replica, request_to_proto(request, request_id))
                    if err.code() == grpc.StatusCode.INVALID_ARGUMENT:  # whole, the same request passed
                        log.info("%s does not take prompt deltas (%s): whole prompts from now on",
                                 replica.address, err.details())
                        replica.deltas = False
        except BaseException:
            self._sent.forget(request.session_id)
            raise
        self._sent.answered(replica.address, request.session_id, request_id, prompt, result.token_ids)
        return result

    async def _send(self, replica: _Replica, message: pb.GenerateRequest) -> GenerateResult:
        replica.outstanding += 1  # counted at once: the next request's placement sees it
        try:
            if self._guard is None:
                return await self._transmit(replica, message)
            return await self._guard.send(replica, self._transmit(replica, message))
        finally:
            replica.outstanding -= 1

    async def _transmit(self, replica: _Replica, message: pb.GenerateRequest) -> GenerateResult:
        stream = replica.stream
        if stream is not None:
            try:
                return result_from_proto(await stream.generate(message, self._timeout_s))
            except grpc.aio.AioRpcError:
                if not stream.unimplemented:
                    raise
                log.warning("%s has no GenerateBatched: one Generate call per request from now on", replica.address)
                replica.stream = None
        call = replica.stub.Generate(message, **self._opts.kw())
        try:
            return await collect(event_from_proto(chunk) async for chunk in call)
        finally:
            call.cancel()

    async def _progress(self, replica: _Replica) -> pb.ModelInfo | None:
        try:
            return await replica.stub.GetModelInfo(
                pb.GetModelInfoRequest(), **self._opts.kw(self._probe_s))
        except grpc.aio.AioRpcError:
            return None

    def _stalled(self, replica: _Replica, stall: Stall) -> None:
        """Avoid the replica (the guard then fails its in-flight sends, so their turns are retried elsewhere)."""
        log.warning("%s; avoided for %.0f s, its %d requests in flight retried on other replicas",
                    stall.describe(), self.unhealthy_s, len(replica.aborts))
        self.stalls.append(stall)
        self.metrics.stalls.inc()
        self._mark_unhealthy(replica)

    async def model_info(self, timeout_s: float = 30.0) -> ModelInfo:
        """GetModelInfo from the first replica that answers."""
        last: grpc.aio.AioRpcError | None = None
        for replica in self._replicas:
            try:
                return info_from_proto(await replica.stub.GetModelInfo(pb.GetModelInfoRequest(),
                                                                       **self._opts.kw(timeout_s)))
            except grpc.aio.AioRpcError as err:
                last = err
        raise InferenceUnavailable(f"no replica answered GetModelInfo: {last}")

    async def update_weights(self, path: str, version: int, timeout_s: float | None = None) -> WeightsUpdate:
        """Make the healthy replicas serve a version: load its folder on them (`weights: push`), or wait
        until they have loaded it themselves (`weights: follow`, t1.inference.follow; one that does not
        within the timeout counts as failed); the others catch up when they come back.

        A replica that fails with UNAVAILABLE or DEADLINE_EXCEEDED is marked unhealthy and skipped;
        other errors propagate (and the pool forgets this version: recovering replicas must not load a
        folder a server refused). Raises InferenceUnavailable when no replica loaded the version.
        """
        previous = self._weights
        if self._weights is None or version >= self._weights[1]:
            self._weights = (path, version)
        now = time.monotonic()
        targets = [r for r in self._replicas if r.healthy(now)]
        skipped = [r.address for r in self._replicas if not r.healthy(now)]
        results = await asyncio.gather(*(self._load(r, path, version, timeout_s or self.weights_timeout_s)
                                         for r in targets), return_exceptions=True)
        updated = []
        for replica, res in zip(targets, results, strict=True):
            retryable = isinstance(res, grpc.aio.AioRpcError) and res.code() in RETRYABLE
            if retryable or isinstance(res, TimeoutError):
                why = f"{res.code().name}: {res.details()}" if isinstance(res, grpc.aio.AioRpcError) else str(res)
                log.warning("weights v%d on %s failed (%s); it catches up when it is back", version,
                            replica.address, why)
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
            raise InferenceUnavailable(f"no replica loaded weights v{version}; skipped {skipped}")
        return WeightsUpdate(version, tuple(updated), tuple(skipped))

    async def _load(self, replica: _Replica, path: str, version: int, timeout_s: float) -> None:
        async with replica.sync_lock:
            if self._follow:
                replica.version = await await_served(replica.stub, version, timeout_s, self._opts.kw,
                                                     self.probe_timeout_s)
                return
            try:
                reply = await replica.stub.UpdateWeights(pb.UpdateWeightsRequest(path=path, version=version),
                                                         **self._opts.kw(timeout_s))
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                # Already past `version` (another coordinator, or this one before a restart, moved it on): fine.
                info = await replica.stub.GetModelInfo(pb.GetModelInfoRequest(), **self._opts.kw(self.probe_timeout_s))
                if int(info.policy_version) < version:
                    raise
                replica.version = int(info.policy_version)
                return
            replica.version = int(reply.policy_version)

    async def close(self) -> None:
        if self._guard is not None:
            await self._guard.close()
        await asyncio.gather(*(r.stream.close() for r in self._replicas if r.stream is not None))
        await asyncio.gather(*(r.channel.close() for r in self._replicas))
