"""InferencePool: the client side of InferenceService over several replicas; a GenerateFn.

A replica set (t1.inference.client.replicas: health, affinity, KV admission, retries, failover, weight updates
and catch-up, metrics) over gRPC transports (t1.inference.client.grpc_transport), plus what only T1's own
servers offer:

- Retries: UNAVAILABLE and DEADLINE_EXCEEDED are retried; a session whose replica failed moves to
  another one and sends its whole context there, so the new replica simply prefills it (a failover).
  A failed attempt's partial tokens are discarded; with a request seed the retry samples the same
  tokens. Other errors (INVALID_ARGUMENT, ...) propagate.
- Prompt deltas (t1.inference.prompt_delta): a session's request that continues the context its
  replica last answered sends only the new ids; a replica that lost that context is sent the whole
  prompt, and one that predates deltas gets whole prompts from then on.
- Weights: `update_weights` loads the new version on the healthy replicas (`weights: push`), or with
  `weights: follow` the servers load versions themselves (t1.inference.follow) and it waits until they
  serve it; a restarted server (which starts on the base model) is caught up before it serves.
- Stalls (t1.inference.client.stall, driven by t1.inference.client.stall_guard): a busy replica that makes no
  progress for `stall_s` (or loads weights past `weights_timeout_s`) is avoided and its in-flight
  requests fail with UNAVAILABLE, so they are retried elsewhere (a failover). `stalls` keeps the verdicts.
- KV admission (`kv_admission`): capacities are what the servers report in GetModelInfo.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar

import grpc
import numpy as np
from prometheus_client import CollectorRegistry

from t1.config.inference import InferencePoolConfig
from t1.config.shared import AuthConfig
from t1.inference.client.affinity import MAX_AFFINITY_ENTRIES
from t1.inference.client.grpc_transport import GrpcTransport
from t1.inference.client.pool_common import InferenceUnavailable, WeightsUpdate
from t1.inference.client.replicas import Replica, ReplicaSet
from t1.inference.client.stall import Stall, StallWatch
from t1.inference.client.stall_guard import StallGuard
from t1.inference.convert import request_to_proto
from t1.inference.prompt_delta import SentContexts
from t1.inference.types import GenerateRequest, GenerateResult, ModelInfo
from t1.v1 import inference_pb2 as pb

__all__ = ["InferencePool", "InferenceUnavailable", "WeightsUpdate"]
log = logging.getLogger(__name__)
R = TypeVar("R")


class InferencePool(ReplicaSet[GrpcTransport]):
    """`await pool(request)` generates one turn on some replica, with affinity, retries and failover."""

    def __init__(self, cfg: InferencePoolConfig, endpoints: Sequence[str] | None = None, *,
                 auth: AuthConfig | None = None, registry: CollectorRegistry | None = None) -> None:
        """Replicas at `endpoints` (default: cfg.endpoints); every limit and switch comes from `cfg`."""
        endpoints = list(cfg.endpoints if endpoints is None else endpoints)
        if not endpoints:
            raise ValueError("InferencePool needs at least one endpoint (inference.pool.endpoints)")
        auth = auth or AuthConfig()
        super().__init__(cfg, [GrpcTransport(a, cfg, auth) for a in endpoints], registry)
        self.probe_timeout_s = cfg.probe_timeout_s
        self._sent = SentContexts(MAX_AFFINITY_ENTRIES)
        self._deltas = cfg.prompt_deltas
        self._ids = itertools.count()
        self._probe_s = min(cfg.probe_timeout_s, cfg.stall_check_s * 4)
        self._guard = StallGuard(StallWatch(cfg.stall_s, cfg.weights_timeout_s), cfg.stall_check_s, self._replicas,
                                 self._progress, self._stalled) if cfg.stall_s > 0 else None
        self.stalls: list[Stall] = []  # the verdicts, oldest first

    def stream_stats(self) -> dict[str, int]:
        """GenerateBatched packing over replicas: messages and requests sent, messages and results received
        (sums), and the most results one reply message carried (the largest)."""
        total: dict[str, int] = {}
        for r in self._replicas:
            stream = r.transport.stream
            for key, value in (stream.stats.items() if stream is not None else ()):
                total[key] = max(total.get(key, 0), value) if key.startswith("most_") else total.get(key, 0) + value
        return total

    def end_session(self, session_id: str) -> None:
        super().end_session(session_id)
        self._sent.forget(session_id)

    async def __call__(self, request: GenerateRequest) -> GenerateResult:
        t0 = time.perf_counter()
        prompt_len = len(request.prompt_ids)
        result = await self._request(request.session_id, "generate", functools.partial(self._attempt, request=request),
                                     prompt_len + request.sampling.max_tokens,
                                     lambda res: prompt_len + len(res.token_ids))
        self.metrics.observe(result, time.perf_counter() - t0)
        return result

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await self(request)

    async def _attempt(self, replica: Replica[GrpcTransport], request: GenerateRequest) -> GenerateResult:
        """One request on one replica: as a prompt delta where the replica holds the session's last
        context (resent whole if it no longer does), else whole."""
        transport = replica.transport
        request_id = f"req-{next(self._ids)}"
        prompt = np.asarray(request.prompt_ids, np.int32)
        delta = (self._sent.delta_for(replica.address, request.session_id, prompt)
                 if self._deltas and transport.deltas else None)
        try:
            if delta is None:
                result = await self._send(replica, transport.transmit(request_to_proto(request, request_id)))
            else:
                self.metrics.prompt_deltas.inc()
                try:
                    result = await self._send(replica, transport.transmit(request_to_proto(request, request_id, delta)))
                except grpc.aio.AioRpcError as err:
                    if err.code() not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                        raise
                    self.metrics.prompt_resends.inc()
                    result = await self._send(replica, transport.transmit(request_to_proto(request, request_id)))
                    if err.code() == grpc.StatusCode.INVALID_ARGUMENT:  # whole, the same request passed
                        log.info("%s does not take prompt deltas (%s): whole prompts from now on",
                                 replica.address, err.details())
                        transport.deltas = False
        except BaseException:
            self._sent.forget(request.session_id)
            raise
        self._sent.answered(replica.address, request.session_id, request_id, prompt, result.token_ids)
        return result

    async def _send(self, replica: Replica[GrpcTransport], sending: Awaitable[R]) -> R:
        if self._guard is None:
            return await super()._send(replica, sending)
        return await super()._send(replica, self._guard.send(replica, sending))

    async def _progress(self, replica: Replica[GrpcTransport]) -> pb.ModelInfo | None:
        return await replica.transport.progress(self._probe_s)

    def _stalled(self, replica: Replica[GrpcTransport], stall: Stall) -> None:
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
                return await replica.transport.model_info(timeout_s)
            except grpc.aio.AioRpcError as err:
                last = err
        raise InferenceUnavailable(f"no replica answered GetModelInfo: {last}")

    async def close(self) -> None:
        if self._guard is not None:
            await self._guard.close()
        await super().close()
