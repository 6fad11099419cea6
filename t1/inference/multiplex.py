"""GenerateBatched on both ends: many generate requests over one long-lived gRPC stream.

A rollout coordinator runs thousands of sessions against a few replicas. One Generate call per turn
costs a call set-up, several messages and a cancel on each side; here each side keeps one stream
per replica and packs whatever is ready into one message:

    client                                            server (per stream)
    generate() -> outbox --writer--> GenerateBatchRequest --> reader -> task per request
    futures   <--reader-- GenerateBatchReply <-- results queue <--------- run_one(request)

By default nothing waits to fill a batch: a writer sends what queued while its previous write was
in flight, so an idle stream adds no latency and a busy one pays one message for many turns. A
linger (`linger_s`, each side its own) trades that much latency per request for fuller messages.
Per-request failures travel as GenerateResult.error_code; a broken stream fails every request it
carried with UNAVAILABLE, which the InferencePool retries like any lost call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from t1.rpc.errors import REQUEST_ERRORS, status_for
from t1.v1 import inference_pb2 as pb
from t1.v1 import inference_pb2_grpc

log = logging.getLogger(__name__)
MAX_BATCH_BYTES = 1 << 20
"""A message stops taking requests (prompts) or results once they reach this size. Receiving
and parsing one message is one uninterrupted step of the receiver's event loop, about 1 ms per MB
on each side; a message that packed everything a starved server had finished (up to 555 results
with their routing, 64 MB, at 4,000 episodes) stalled the coordinator's loop for tens of ms.
Bigger messages save only the fixed cost of a message (about 40 us). The budget is soft: the
request or result that reaches it still joins the message, so one larger than it travels too."""
MAX_BATCH_REQUESTS = 512
SWEEP_S = 0.5   # how often a stream checks its requests' deadlines (at most timeout / 8 between checks)
# Stream-level failures that say something about the caller, not the transport: never retried.
FATAL_STREAM_CODES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                                grpc.StatusCode.UNIMPLEMENTED})
RunOne = Callable[[pb.GenerateRequest], Awaitable[pb.GenerateResult]]


def error_result(request_id: str, code: grpc.StatusCode, message: str) -> pb.GenerateResult:
    return pb.GenerateResult(request_id=request_id, error_code=code.value[0], error_message=message)


def _fitting(outbox: list[pb.GenerateRequest], max_bytes: int) -> int:
    """How many requests from the front of `outbox` go in one message: at least one, at most
    MAX_BATCH_REQUESTS, and no more once their prompts reach `max_bytes`."""
    size = 0
    for i, request in enumerate(outbox[:MAX_BATCH_REQUESTS]):
        size += len(request.prompt_ids.data) + 64
        if size >= max_bytes:
            return i + 1
    return min(len(outbox), MAX_BATCH_REQUESTS)


def _result_bytes(result: pb.GenerateResult) -> int:
    """Payload size without serialising: the tensors dominate."""
    return (len(result.token_ids.data) + len(result.logprobs.data) + len(result.token_versions.data)
            + len(result.done.routing.experts.data) + 128)


class BatchedSession:
    """The server side of one GenerateBatched stream: a task per request, results packed as they finish."""

    def __init__(self, run_one: RunOne, max_batch_bytes: int = MAX_BATCH_BYTES, linger_s: float = 0.0) -> None:
        self.run_one = run_one
        self.max_batch_bytes = max_batch_bytes
        self.linger_s = linger_s
        self.running: dict[str, asyncio.Task[None]] = {}
        self._results: asyncio.Queue[pb.GenerateResult | None] = asyncio.Queue()

    async def serve(self, requests: AsyncIterator[pb.GenerateBatchRequest]) -> AsyncIterator[pb.GenerateBatchReply]:
        reader = asyncio.create_task(self._read(requests), name="generate-batched-reader")
        try:
            while True:
                first = await self._results.get()
                if first is None:
                    return
                if self.linger_s > 0:  # let more results finish into this message
                    await asyncio.sleep(self.linger_s)
                batch, size, end = [first], _result_bytes(first), False
                while size < self.max_batch_bytes and not self._results.empty():
                    item = self._results.get_nowait()
                    if item is None:
                        end = True
                        break
                    batch.append(item)
                    size += _result_bytes(item)
                yield pb.GenerateBatchReply(results=batch)
                if end:
                    return
        finally:  # the client went away (or finished): nothing of this stream keeps running
            reader.cancel()
            for task in list(self.running.values()):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read(self, requests: AsyncIterator[pb.GenerateBatchRequest]) -> None:
        try:
            async for message in requests:
                for request_id in message.cancel:
                    task = self.running.get(request_id)
                    if task is not None:
                        task.cancel()
                for request in message.requests:
                    self._start(request)
        except grpc.aio.AioRpcError as err:  # the client's side broke; serve() is cancelled with the call
            log.info("GenerateBatched stream ended by the client: %s", err.code().name)
        # The client is done writing: answer what runs, then end the stream.
        while self.running:
            await asyncio.gather(*self.running.values(), return_exceptions=True)
        self._results.put_nowait(None)

    def _start(self, request: pb.GenerateRequest) -> None:
        request_id = request.request_id
        if not request_id:
            self._results.put_nowait(error_result("", grpc.StatusCode.INVALID_ARGUMENT,
                                                  "requests.request_id: required on GenerateBatched"))
        elif request_id in self.running:
            self._results.put_nowait(error_result(request_id, grpc.StatusCode.INVALID_ARGUMENT,
                                                  f"requests.request_id: {request_id!r} is already running"))
        else:
            self.running[request_id] = asyncio.create_task(self._one(request), name=f"generate-{request_id}")

    async def _one(self, request: pb.GenerateRequest) -> None:
        request_id = request.request_id
        try:
            result = await self.run_one(request)
            result.request_id = request_id
        except asyncio.CancelledError:
            result = error_result(request_id, grpc.StatusCode.CANCELLED, "cancelled by the client")
        except REQUEST_ERRORS as exc:  # RequestError, TensorError: the message names the field
            code = status_for(exc)
            assert code is not None
            result = error_result(request_id, code, str(exc))
        except Exception as exc:
            log.exception("generate %s (session %s) failed", request_id, request.session_id)
            result = error_result(request_id, grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        finally:
            self.running.pop(request_id, None)
        self._results.put_nowait(result)


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """An error shaped like a failed call, so callers handle stream and call failures alike."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class BatchedStream:
    """The client side: one GenerateBatched stream to one replica, opened on first use and after a break.

    `generate` raises grpc.aio.AioRpcError like a Generate call would: the request's own error code,
    DEADLINE_EXCEEDED once `timeout_s` has passed (checked every SWEEP_S, or timeout / 8 if shorter;
    the request is cancelled on the server), or UNAVAILABLE when
    the stream broke under it. `unimplemented` turns true when the server has no GenerateBatched.
    """

    def __init__(self, stub: inference_pb2_grpc.InferenceServiceStub, address: str,
                 metadata: tuple[tuple[str, str], ...] = (), linger_s: float = 0.0,
                 max_batch_bytes: int = MAX_BATCH_BYTES) -> None:
        self.stub, self.address, self.metadata = stub, address, metadata
        self.linger_s = linger_s
        self.max_batch_bytes = max_batch_bytes
        self.unimplemented = False
        self._call: grpc.aio.StreamStreamCall | None = None
        self._pending: dict[str, asyncio.Future[pb.GenerateResult]] = {}
        self._outbox: list[pb.GenerateRequest] = []
        self._cancels: list[str] = []
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # timeout -> {request id: loop deadline}: within one timeout, insertion order is deadline order,
        # so a sweep stops at the first request not yet due instead of walking all in flight.
        self._deadlines: dict[float, dict[str, float]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._sweep_s = SWEEP_S
        # How well packing works: requests per message sent, results per message received.
        self.stats = {"messages_sent": 0, "requests_sent": 0, "messages_received": 0, "results_received": 0,
                      "most_results_in_a_message": 0}

    async def generate(self, request: pb.GenerateRequest, timeout_s: float) -> pb.GenerateResult:
        request_id = request.request_id
        if request_id in self._pending:
            raise ValueError(f"request_id: {request_id!r} is already in flight on {self.address}")
        self._open()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[pb.GenerateResult] = loop.create_future()
        self._pending[request_id] = future
        due = self._deadlines.get(timeout_s)
        if due is None:
            due = self._deadlines[timeout_s] = {}
        due[request_id] = loop.time() + timeout_s
        self._watch_deadlines(timeout_s)
        self._outbox.append(request)
        self._wake.set()
        try:
            result = await future
        except asyncio.CancelledError:
            self._abandon(request_id)
            raise
        finally:
            due.pop(request_id, None)
        if result.error_code:
            raise rpc_error(_CODES.get(result.error_code, grpc.StatusCode.UNKNOWN), result.error_message)
        return result

    def _watch_deadlines(self, timeout_s: float) -> None:
        """One sweeper per stream instead of a timer per request (thousands of requests in flight)."""
        self._sweep_s = min(self._sweep_s, max(timeout_s / 8, 0.01))
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep(), name=f"generate-batched-deadlines-{self.address}")

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while any(self._deadlines.values()):
            await asyncio.sleep(self._sweep_s)
            now = loop.time()
            expired = []
            for timeout_s, due in self._deadlines.items():
                for request_id, deadline in due.items():
                    if now < deadline:
                        break
                    expired.append((request_id, timeout_s))
            for request_id, timeout_s in expired:
                del self._deadlines[timeout_s][request_id]
                future = self._pending.get(request_id)
                self._abandon(request_id)  # cancels it on the server
                if future is not None and not future.done():
                    future.set_exception(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED,
                                                   f"no result from {self.address} within {timeout_s:g} s"))
            for timeout_s in [t for t, due in self._deadlines.items() if not due]:
                del self._deadlines[timeout_s]
        self._sweep_s = SWEEP_S

    def _abandon(self, request_id: str) -> None:
        """The caller gave up: drop the request if unsent, else ask the server to cancel it."""
        if self._pending.pop(request_id, None) is None:
            return
        for i, queued in enumerate(self._outbox):
            if queued.request_id == request_id:
                del self._outbox[i]
                return
        self._cancels.append(request_id)
        self._wake.set()

    def _open(self) -> None:
        if self._call is not None:
            return
        call = self.stub.GenerateBatched(metadata=self.metadata)
        self._call = call
        self._tasks = [asyncio.create_task(self._write(call), name=f"generate-batched-writer-{self.address}"),
                       asyncio.create_task(self._read(call), name=f"generate-batched-reader-{self.address}")]

    async def _write(self, call: grpc.aio.StreamStreamCall) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):  # the reader reports breaks
            while True:
                await self._wake.wait()
                if self.linger_s > 0:  # let more requests queue into this message
                    await asyncio.sleep(self.linger_s)
                self._wake.clear()
                while self._outbox or self._cancels:
                    n = _fitting(self._outbox, self.max_batch_bytes)
                    requests, self._outbox = self._outbox[:n], self._outbox[n:]
                    cancels, self._cancels = self._cancels, []
                    await call.write(pb.GenerateBatchRequest(requests=requests, cancel=cancels))
                    self.stats["messages_sent"] += 1
                    self.stats["requests_sent"] += len(requests)

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        error = rpc_error(grpc.StatusCode.UNAVAILABLE, f"GenerateBatched stream to {self.address} ended")
        try:
            async for reply in call:
                stats = self.stats
                stats["messages_received"] += 1
                stats["results_received"] += len(reply.results)
                if len(reply.results) > stats["most_results_in_a_message"]:
                    stats["most_results_in_a_message"] = len(reply.results)
                for result in reply.results:
                    future = self._pending.pop(result.request_id, None)
                    if future is not None and not future.done():
                        future.set_result(result)
        except grpc.aio.AioRpcError as err:
            if err.code() in FATAL_STREAM_CODES:
                self.unimplemented = err.code() == grpc.StatusCode.UNIMPLEMENTED
                error = err
            else:
                error = rpc_error(grpc.StatusCode.UNAVAILABLE, f"GenerateBatched stream to {self.address} broke: "
                                                               f"{err.code().name}: {err.details()}")
        except asyncio.CancelledError:
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, f"GenerateBatched stream to {self.address} closed")
            raise
        finally:
            self._broken(call, error)

    def _broken(self, call: grpc.aio.StreamStreamCall, error: grpc.aio.AioRpcError) -> None:
        """Fail every request the stream carried; the next generate opens a new stream."""
        call.cancel()
        if self._call is call:
            self._call = None
            for task in self._tasks:
                if task is not asyncio.current_task():
                    task.cancel()
            self._tasks = []
        pending, self._pending = self._pending, {}
        self._outbox.clear()
        self._cancels.clear()
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    async def close(self) -> None:
        call, tasks = self._call, self._tasks
        if self._sweeper is not None:
            tasks.append(self._sweeper)
        self._call, self._tasks, self._sweeper = None, [], None
        if call is not None:
            call.cancel()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


_CODES = {code.value[0]: code for code in grpc.StatusCode}
