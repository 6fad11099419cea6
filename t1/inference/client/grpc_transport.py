"""One T1 inference server over gRPC: the transport of `InferencePool`'s replicas (t1.inference.client.replicas).

- Requests: by default one long-lived GenerateBatched stream carries all of the replica's requests
  (t1.inference.multiplex); a server without it (UNIMPLEMENTED) is sent one Generate call per request
  from then on. Every call has a deadline.
- Retryable: UNAVAILABLE and DEADLINE_EXCEEDED (a broken stream fails its requests with UNAVAILABLE);
  every other status propagates.
- Weights: `weights: push` loads a folder with UpdateWeights (a server already past the version, as
  another coordinator left it, is fine); `weights: follow` waits until the server, which loads versions
  itself (t1.inference.follow), serves it.
- Probes: GetModelInfo answers the version (waiting for a channel whose server died to reconnect), the
  KV capacity and, for the stall watch (t1.inference.client.stall_guard), the server's progress.
"""

from __future__ import annotations

import logging

import grpc

from t1.config.inference import InferencePoolConfig, WeightsMode
from t1.config.shared import AuthConfig
from t1.inference.client.replicas import Failure
from t1.inference.convert import event_from_proto, info_from_proto, result_from_proto
from t1.inference.follow import await_served
from t1.inference.multiplex import BatchedStream
from t1.inference.types import GenerateResult, ModelInfo, collect
from t1.rpc.client import call_options, make_channel
from t1.v1 import inference_pb2 as pb
from t1.v1 import inference_pb2_grpc

log = logging.getLogger(__name__)
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class GrpcTransport:
    """One replica's channel, stub and stream; every limit and switch comes from the pool's config."""

    def __init__(self, address: str, cfg: InferencePoolConfig, auth: AuthConfig) -> None:
        self._address = address
        self.channel = make_channel(address, auth)
        self.stub = inference_pb2_grpc.InferenceServiceStub(self.channel)
        self._opts = call_options(auth, cfg.request_timeout_s)
        self._timeout_s, self._probe_timeout_s = cfg.request_timeout_s, cfg.probe_timeout_s
        self._follow = cfg.weights == WeightsMode.FOLLOW  # the servers load versions themselves
        self.stream = (BatchedStream(self.stub, address, self._opts.metadata, cfg.batch_linger_ms / 1e3)
                       if cfg.batched_stream else None)  # None: one Generate call per request
        self.deltas = True  # takes prompt deltas (False once it answered one as a server without them)

    @property
    def address(self) -> str:
        return self._address

    def failure(self, error: Exception) -> Failure | None:
        if isinstance(error, grpc.aio.AioRpcError) and error.code() in RETRYABLE:
            return Failure(f"{error.code().name}: {error.details()}")
        return None

    async def transmit(self, message: pb.GenerateRequest) -> GenerateResult:
        """One request: over the stream, or as a Generate call of its own."""
        stream = self.stream
        if stream is not None:
            try:
                return result_from_proto(await stream.generate(message, self._timeout_s))
            except grpc.aio.AioRpcError:
                if not stream.unimplemented:
                    raise
                log.warning("%s has no GenerateBatched: one Generate call per request from now on", self._address)
                self.stream = None
        call = self.stub.Generate(message, **self._opts.kw())
        try:
            return await collect(event_from_proto(chunk) async for chunk in call)
        finally:
            call.cancel()

    async def info(self, timeout_s: float, wait_for_ready: bool = False) -> pb.ModelInfo:
        return await self.stub.GetModelInfo(pb.GetModelInfoRequest(), wait_for_ready=wait_for_ready,
                                            **self._opts.kw(timeout_s))

    async def model_info(self, timeout_s: float) -> ModelInfo:
        return info_from_proto(await self.info(timeout_s))

    async def progress(self, timeout_s: float) -> pb.ModelInfo | None:
        """The server's progress for the stall watch; None when it does not answer."""
        try:
            return await self.info(timeout_s)
        except grpc.aio.AioRpcError:
            return None

    async def capacity(self) -> tuple[int, int] | None:
        try:
            info = await self.info(self._probe_timeout_s)
        except grpc.aio.AioRpcError as err:
            log.warning("%s: no KV capacity (%s); admitted without a bound until it answers", self._address,
                        err.code().name)
            return None
        return int(info.kv_capacity_tokens), int(info.max_context_tokens)

    async def served_version(self) -> int:
        # wait_for_ready: a channel whose server died stays failed until a call asks it to reconnect.
        info = await self.info(min(self._probe_timeout_s, self._timeout_s), wait_for_ready=True)
        return int(info.policy_version)

    async def load_weights(self, path: str, version: int, timeout_s: float) -> int:
        if self._follow:  # it loads versions itself: wait until it serves this one
            return await await_served(self.stub, version, timeout_s, self._opts.kw, self._probe_timeout_s)
        try:
            reply = await self.stub.UpdateWeights(pb.UpdateWeightsRequest(path=path, version=version),
                                                  **self._opts.kw(timeout_s))
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            # Already past `version` (another coordinator, or this one before a restart, moved it on): fine.
            served = int((await self.info(self._probe_timeout_s)).policy_version)
            if served < version:
                raise
            return served
        return int(reply.policy_version)

    async def close(self) -> None:
        if self.stream is not None:
            await self.stream.close()
        await self.channel.close()
