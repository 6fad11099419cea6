"""A simulated t1.v1.InferenceService: real gRPC, the real request contract, no model.

It answers Generate the way the torch and vLLM backends do, minus the model: per session it keeps
the processed context (prompt + sampled ids but the last, as a KV cache would), reports
`cached_tokens` as the prefix a new prompt shares with it, and returns routing rows for every
position processed for the first time, from the first uncached prompt position to the
second-to-last sampled token, shaped [rows, 48, 8] uint8 by default. Replies are real tokenized
tool calls (see sim_replies), streamed in chunks; latency is per request, per prefilled token and
per sampled token. GenerateBatched (one stream, whole results) serves the same turns.

With a KV capacity (`kv_capacity_tokens`, `--kv-capacity-tokens`; 0: none) it behaves like a paged
KV cache: a running turn holds its prompt and reply, a cached session its processed context; a turn
that does not fit first drops idle sessions' caches, least recently used first (their next turn
prefills everything again), then waits for running turns to end. GetModelInfo reports capacity and
use. Used by bench/load/run.py, which starts it in its own process, and bench/kv_admission.py::

    python -m bench.sim_inference --tokenizer .t1/models/tiny/tokenizer.json --port 0 --ready-file P
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.sim_replies import (
    CommandMix,
    LogprobPool,
    ModelShape,
    ReplyBook,
    ReplySettings,
    RoutingPool,
)
from t1.config.shared import AuthConfig, ServerConfig
from t1.inference.multiplex import MAX_BATCH_BYTES, BatchedSession
from t1.inference.prompt_delta import ServedContexts
from t1.rpc.errors import RequestError, rpc_errors
from t1.rpc.server import GrpcServer, ServiceBinding
from t1.rpc.tensors import routing_to_proto, to_tensor
from t1.v1 import inference_pb2 as pb
from t1.v1 import inference_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Latency:
    """Simulated time: per request (scheduling, first-token overhead), per prefilled token, per sampled token."""

    per_request_s: float = 0.05
    per_prefill_token_s: float = 0.00002
    per_token_s: float = 0.02
    chunk_tokens: int = 64   # tokens per streamed TokenChunk; 0 sends one chunk at the end
    linger_s: float = 0.0    # GenerateBatched: wait this long before replying, so more results share a message


@dataclass(frozen=True, slots=True)
class _Turn:
    prompt: np.ndarray
    cached: int
    reply: np.ndarray
    logprobs: np.ndarray
    finish: int
    version: int
    prefill_s: float


def processed_context(prompt: np.ndarray, sampled: np.ndarray) -> np.ndarray:
    """What a KV cache holds after a turn: the prompt and every sampled token but the last (never fed in)."""
    return np.concatenate([prompt, sampled[:-1]])


def cached_prefix(prompt: np.ndarray, cached: np.ndarray | None) -> int:
    """Prompt tokens servable from the cache: the common prefix, leaving at least one position to process."""
    if cached is None or len(cached) == 0:
        return 0
    n = min(len(prompt), len(cached))
    diff = np.flatnonzero(prompt[:n] != cached[:n])
    common = int(diff[0]) if len(diff) else n
    return min(common, len(prompt) - 1)


class SimInferenceServicer(pb_grpc.InferenceServiceServicer):
    """Generate, GetModelInfo and UpdateWeights over a ReplyBook and routing pool."""

    def __init__(self, book: ReplyBook, shape: ModelShape, latency: Latency, seed: int = 0,
                 max_sessions: int = 16384, max_batch_bytes: int = 0, kv_capacity_tokens: int = 0) -> None:
        self.book = book
        self.kv_capacity_tokens = kv_capacity_tokens
        self.kv_cached = 0    # positions the idle sessions' caches hold
        self.kv_running = 0   # positions the running turns hold
        self.kv_evictions = 0  # idle sessions' caches dropped for room
        self._room = asyncio.Event()
        self.max_batch_bytes = max_batch_bytes  # 0: GenerateBatched's default
        self.shape = shape
        self.latency = latency
        self.version = 0
        self.max_sessions = max_sessions
        self._rng = np.random.default_rng(seed)
        self._routing = RoutingPool(shape, seed=seed)
        self._logprobs = LogprobPool(seed=seed + 1)
        self._sessions: OrderedDict[str, np.ndarray] = OrderedDict()
        self.contexts = ServedContexts()
        self.prompt_deltas = 0
        self.requests = 0
        self.sampled_tokens = 0
        self.prefilled_tokens = 0

    def _validate(self, request: pb.GenerateRequest) -> np.ndarray:
        if not request.session_id:
            raise RequestError("session_id: must not be empty")
        prompt = self.contexts.full_prompt(request)  # prompt_ids, or a delta on the session's last context
        self.prompt_deltas += request.HasField("prompt_delta")
        if len(prompt) == 0:
            raise RequestError("prompt_ids: must not be empty")
        if prompt.min() < 0 or prompt.max() >= self.book.vocab_size:
            raise RequestError(f"prompt_ids: ids must lie in [0, {self.book.vocab_size})")
        if len(prompt) >= self.shape.max_context_tokens:
            raise RequestError(f"prompt_ids: {len(prompt)} tokens reach the context limit "
                               f"{self.shape.max_context_tokens}")
        if request.sampling.max_tokens < 0:
            raise RequestError("sampling.max_tokens: must be >= 0")
        return prompt

    async def _admit(self, request: pb.GenerateRequest) -> _Turn:
        """Plan the turn, then wait for KV room for its prompt and reply (dropping idle caches first)."""
        turn = self._plan(request)
        if not self.kv_capacity_tokens:
            return turn
        need = len(turn.prompt) + len(turn.reply)
        while self.kv_running + self.kv_cached + need > self.kv_capacity_tokens:
            if self._sessions:
                _, context = self._sessions.popitem(last=False)
                self.kv_cached -= len(context)
                self.kv_evictions += 1
                continue
            if self.kv_running == 0:
                break  # alone and still too long: it runs anyway (the context limit is the model's)
            self._room.clear()
            await self._room.wait()
        self.kv_running += need
        return turn

    def _release(self, turn: _Turn) -> None:
        if self.kv_capacity_tokens:
            self.kv_running -= len(turn.prompt) + len(turn.reply)
            self._room.set()

    def _plan(self, request: pb.GenerateRequest) -> _Turn:
        """What this request will return: the reply, its logprobs, the cached prefix and the simulated prefill time."""
        prompt = self._validate(request)
        held = self._sessions.pop(request.session_id, None) if self.kv_capacity_tokens else None
        if held is not None:  # a running turn holds its session's cache (counted in kv_running)
            self.kv_cached -= len(held)
        cached = cached_prefix(prompt, held if self.kv_capacity_tokens else self._sessions.get(request.session_id))
        reply, _ = self.book.reply(self._rng)
        room = self.shape.max_context_tokens - len(prompt)
        limit = min(request.sampling.max_tokens or self.book.max_tokens, room)
        finish = pb.FINISH_REASON_STOP
        if len(reply) > limit:
            reply, finish = reply[:limit], pb.FINISH_REASON_LENGTH
        lat = self.latency
        return _Turn(prompt, cached, reply, self._logprobs.take(len(reply), self._rng), finish, self.version,
                     lat.per_request_s + lat.per_prefill_token_s * (len(prompt) - cached))

    def _finish(self, request: pb.GenerateRequest, turn: _Turn) -> pb.GenerateDone:
        """The GenerateDone of a served turn (routing of every newly processed position); updates the session."""
        prompt, reply, cached = turn.prompt, turn.reply, turn.cached
        done = pb.GenerateDone(finish_reason=turn.finish, policy_version=turn.version, prompt_tokens=len(prompt),
                               cached_tokens=cached, completion_tokens=len(reply))
        if request.return_routing:
            rows = len(prompt) + len(reply) - 1 - cached
            done.routing.CopyFrom(routing_to_proto(self._routing.block(cached, rows, self._rng)))
        self._remember(request.session_id, processed_context(prompt, reply))
        self.contexts.remember(request.session_id, request.request_id, prompt, reply)
        self.requests += 1
        self.sampled_tokens += len(reply)
        self.prefilled_tokens += len(prompt) - cached
        return done

    @rpc_errors
    async def Generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[pb.GenerateChunk]:
        turn = await self._admit(request)
        try:
            async for chunk in self._chunks(request, turn):
                yield chunk
        finally:
            self._release(turn)

    async def _chunks(self, request: pb.GenerateRequest, turn: _Turn) -> AsyncIterator[pb.GenerateChunk]:
        await asyncio.sleep(turn.prefill_s)
        reply, logprobs = turn.reply, turn.logprobs
        step = self.latency.chunk_tokens or len(reply)
        for lo in range(0, len(reply), step):
            hi = min(lo + step, len(reply))
            await asyncio.sleep(self.latency.per_token_s * (hi - lo))
            yield pb.GenerateChunk(tokens=pb.TokenChunk(
                token_ids=to_tensor(reply[lo:hi]), logprobs=to_tensor(logprobs[lo:hi]), policy_version=turn.version))
        yield pb.GenerateChunk(done=self._finish(request, turn))

    async def GenerateBatched(self, request_iterator: AsyncIterator[pb.GenerateBatchRequest],
                              context: Any) -> AsyncIterator[pb.GenerateBatchReply]:
        session = BatchedSession(self._run_one, self.max_batch_bytes or MAX_BATCH_BYTES, self.latency.linger_s)
        async for reply in session.serve(request_iterator):
            yield reply

    async def _run_one(self, request: pb.GenerateRequest) -> pb.GenerateResult:
        """One whole turn for GenerateBatched: the same latency as Generate, in one sleep."""
        turn = await self._admit(request)
        try:
            await asyncio.sleep(turn.prefill_s + self.latency.per_token_s * len(turn.reply))
        finally:
            self._release(turn)
        versions = np.full(len(turn.reply), turn.version, dtype=np.int32)
        return pb.GenerateResult(request_id=request.request_id, token_ids=to_tensor(turn.reply),
                                 logprobs=to_tensor(turn.logprobs), token_versions=to_tensor(versions),
                                 done=self._finish(request, turn))

    def _remember(self, session_id: str, context: np.ndarray) -> None:
        if self.kv_capacity_tokens:
            self.kv_cached += len(context) - len(self._sessions.get(session_id, ()))
        self._sessions[session_id] = context
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.max_sessions:
            _, dropped = self._sessions.popitem(last=False)
            self.kv_cached -= len(dropped) if self.kv_capacity_tokens else 0

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: Any) -> pb.ModelInfo:
        return pb.ModelInfo(
            model_name="sim", backend="sim", policy_version=self.version, vocab_size=self.book.vocab_size,
            max_context_tokens=self.shape.max_context_tokens, num_moe_layers=self.shape.num_layers,
            num_experts=self.shape.num_experts, top_k=self.shape.top_k,
            routing_dtype=self._routing.block(0, 1, self._rng).experts.dtype.name,
            eos_token_ids=[self.book.eos_id], logprob_distribution="sampling", dtype="sim",
            kv_capacity_tokens=self.kv_capacity_tokens, kv_used_tokens=self.kv_cached + self.kv_running,
        )

    @rpc_errors
    async def UpdateWeights(self, request: pb.UpdateWeightsRequest, context: Any) -> pb.UpdateWeightsResponse:
        if request.version < self.version:
            raise RequestError(f"version: {request.version} is older than the loaded {self.version}")
        self.version = int(request.version)
        return pb.UpdateWeightsResponse(policy_version=self.version, load_seconds=0.0)


def binding(servicer: SimInferenceServicer) -> ServiceBinding:
    return ServiceBinding("t1.v1.InferenceService", pb_grpc.add_InferenceServiceServicer_to_server, servicer)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Simulated t1.v1.InferenceService for load tests.")
    p.add_argument("--tokenizer", type=Path, required=True, help="tokenizer.json of the policy's model folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ready-file", type=Path, help="write the bound port here once serving")
    p.add_argument("--commands", choices=[c.value for c in CommandMix], default="fast")
    p.add_argument("--min-tokens", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--per-request-ms", type=float, default=50.0)
    p.add_argument("--per-token-ms", type=float, default=20.0)
    p.add_argument("--per-prefill-token-ms", type=float, default=0.02)
    p.add_argument("--chunk-tokens", type=int, default=64)
    p.add_argument("--linger-ms", type=float, default=0.0)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-capacity-tokens", type=int, default=0, help="KV cache in tokens (0: unbounded)")
    p.add_argument("--reply-max-mb", type=float, default=0.0,
                   help="GenerateBatched: most bytes of results per reply message (0: the server's default)")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    book = ReplyBook(args.tokenizer, ReplySettings(args.min_tokens, args.max_tokens, CommandMix(args.commands)))
    shape = ModelShape(args.layers, args.experts, args.top_k, vocab_size=book.vocab_size)
    latency = Latency(args.per_request_ms / 1e3, args.per_prefill_token_ms / 1e3, args.per_token_ms / 1e3,
                      args.chunk_tokens, args.linger_ms / 1e3)
    servicer = SimInferenceServicer(
        book,
        shape,
        latency,
        seed=args.seed,
        max_batch_bytes=int(args.reply_max_mb * 2**20),
        kv_capacity_tokens=args.kv_capacity_tokens,
    )
    server = GrpcServer([binding(servicer)], ServerConfig(host=args.host, port=args.port, grace_s=1.0), AuthConfig())
    port = await server.start()
    if args.ready_file:
        tmp = args.ready_file.with_suffix(".tmp")
        tmp.write_text(str(port))
        tmp.rename(args.ready_file)
    try:
        await server.wait_for_termination()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING)
    from t1.rpc.loop import run

    run(serve(_parse(argv)))


if __name__ == "__main__":
    main()
