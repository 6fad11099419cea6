"""InferenceService servicer: streams a backend's chunks, reports model info, loads new weights.

UpdateWeights loads a version at most once: the version already served is a no-op (several
callers, or one retrying, load it once), an older one is refused unless the request says rollback.

Generate streams one request's chunks; GenerateBatched (t1.inference.multiplex) answers many
requests over one stream with whole results, folded from the same backend streams.

A client that goes away cancels its Generate handler; the cancellation reaches the backend stream
at its next step and the request's session cache is dropped (it may be half-updated).

Each session's last served context is kept (`t1.inference.prompt_delta.ServedContexts`), so its
next request may send only the ids it adds (`prompt_delta`).

GetModelInfo reports progress (requests running, tokens sampled since start, how long the weight
load in progress has run), which the pool's stall watch (t1.inference.client.stall) reads. `hold_generation`
is a test hook: generation (and weight loading) stops while the server keeps answering, the failure mode the watch
catches.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np

from t1.inference.convert import event_to_proto, info_to_proto, request_from_proto, result_to_proto
from t1.inference.multiplex import BatchedSession
from t1.inference.prompt_delta import SERVED_CONTEXT_TOKENS, ServedContexts
from t1.inference.types import Backend, GenerateDone, GenerateRequest, TokenChunk, collect
from t1.rpc.errors import FailedPrecondition, RequestError, rpc_errors
from t1.rpc.server import ServiceBinding
from t1.v1 import inference_pb2 as pb
from t1.v1 import inference_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = "t1.v1.InferenceService"


MAX_POLICY_VERSION = 2**31 - 1
"""Versions travel as int32 beside every sampled token: a larger one (UpdateWeights(version=2**62)) would make
every honest version after it "older" and lock the server out of its updates."""


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(self, backend: Backend, batch_linger_s: float = 0.0,
                 served_context_tokens: int = SERVED_CONTEXT_TOKENS) -> None:
        self.backend = backend
        self.batch_linger_s = batch_linger_s
        self.cancelled = 0
        self.contexts = ServedContexts(served_context_tokens)  # the bases of prompt deltas
        self.prompt_deltas = 0  # requests that came as a delta
        self.weight_loads = 0  # UpdateWeights calls that loaded weights (no-ops not counted)
        self._weights_lock = asyncio.Lock()
        self.active_requests = 0
        self.completed_tokens = 0  # sampled since start
        self._loading_since: float | None = None  # monotonic start of the weight load in progress
        self._running = asyncio.Event()  # cleared by hold_generation
        self._running.set()
        self.follows = ""  # the trainer whose versions this server loads itself: UpdateWeights is refused

    def hold_generation(self, hold: bool) -> None:
        """Test hook: stop passing generated tokens on and starting weight loads (True), or resume (False);
        GetModelInfo answers either way."""
        if hold:
            self._running.clear()
        else:
            self._running.set()

    async def _progress(self, req: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateDone]:
        """The backend's stream of `req`, counted in active_requests and completed_tokens."""
        events = self.backend.stream(req)
        self.active_requests += 1
        try:
            async for event in events:
                await self._running.wait()
                if isinstance(event, TokenChunk):
                    self.completed_tokens += len(event.token_ids)
                yield event
        finally:
            self.active_requests -= 1
            await events.aclose()  # type: ignore[attr-defined]

    def _request(self, request: pb.GenerateRequest) -> GenerateRequest:
        req = request_from_proto(request, self.contexts)
        self.prompt_deltas += request.HasField("prompt_delta")
        return req

    @rpc_errors
    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[pb.GenerateChunk]:
        req = self._request(request)
        events = self._progress(req)
        sampled: list[np.ndarray] = []
        try:
            async for event in events:
                if isinstance(event, TokenChunk):
                    sampled.append(event.token_ids)
                else:
                    self.contexts.remember(request.session_id, request.request_id, req.prompt_ids,
                                           np.concatenate(sampled) if sampled else np.zeros(0, np.int32))
                yield event_to_proto(event)
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            log.info("generate %s (session %s) cancelled by the client", request.request_id, request.session_id)
            raise
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    async def GenerateBatched(self, request_iterator: AsyncIterator[pb.GenerateBatchRequest],
                              context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateBatchReply]:
        async for reply in BatchedSession(self._run_one, linger_s=self.batch_linger_s).serve(request_iterator):
            yield reply

    async def _run_one(self, request: pb.GenerateRequest) -> pb.GenerateResult:
        req = self._request(request)
        try:
            result = await collect(self._progress(req))
        except asyncio.CancelledError:
            self.cancelled += 1
            log.info("generate %s (session %s) cancelled by the client", request.request_id, request.session_id)
            raise
        self.contexts.remember(request.session_id, request.request_id, req.prompt_ids, result.token_ids)
        return result_to_proto(request.request_id, result)

    @rpc_errors
    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
                           ) -> pb.ModelInfo:
        info = info_to_proto(self.backend.model_info())
        info.weight_loads = self.weight_loads
        info.active_requests = self.active_requests
        info.completed_tokens = self.completed_tokens
        info.model_steps = getattr(self.backend, "num_steps", 0)
        kv_usage = getattr(self.backend, "kv_usage", None)  # backends that know their KV budget
        if kv_usage is not None:
            info.kv_capacity_tokens, info.kv_used_tokens = kv_usage()
        if self._loading_since is not None:
            info.weights_loading_s = time.monotonic() - self._loading_since
        return info

    @rpc_errors
    async def UpdateWeights(self, request: pb.UpdateWeightsRequest, context: grpc.aio.ServicerContext
                            ) -> pb.UpdateWeightsResponse:
        if not request.path:
            raise RequestError("path: required")
        if not 0 <= request.version <= MAX_POLICY_VERSION:
            raise RequestError(f"version: must be in [0, {MAX_POLICY_VERSION}], got {request.version}")
        if self.follows:
            raise FailedPrecondition(f"this server follows the trainer at {self.follows} "
                                     "(inference.server.follow_trainer): its weight versions come from there only")
        return await self.load_version(request.path, request.version, request.rollback)

    async def load_version(self, path: str, version: int, rollback: bool = False) -> pb.UpdateWeightsResponse:
        """Serve `version` from `path`, loading it only when it is not served yet (UpdateWeights, and the
        trainer follower of `t1.inference.follow`)."""
        async with self._weights_lock:  # a second caller of the same version waits, then finds it served
            current = self.backend.model_info().policy_version
            if version == current:
                return pb.UpdateWeightsResponse(policy_version=current, load_seconds=0.0, loaded=False)
            if version < current and not rollback:
                raise FailedPrecondition(f"version: {version} is older than the served version {current}; "
                                         "set rollback to go back")
            if version < current:
                log.warning("UpdateWeights rolls back from version %d to %d (%s)", current, version, path)
            self._loading_since = time.monotonic()
            try:
                await self._running.wait()
                seconds = await self.backend.update_weights(path, version)
            finally:
                self._loading_since = None
            self.weight_loads += 1
            log.info("loaded weights v%d from %s in %.2fs", version, path, seconds)
        return pb.UpdateWeightsResponse(policy_version=self.backend.model_info().policy_version,
                                        load_seconds=seconds, loaded=True)


def inference_binding(backend: Backend, batch_linger_s: float = 0.0,
                      servicer: InferenceServicer | None = None) -> ServiceBinding:
    return ServiceBinding(SERVICE_NAME, inference_pb2_grpc.add_InferenceServiceServicer_to_server,
                          servicer or InferenceServicer(backend, batch_linger_s))
