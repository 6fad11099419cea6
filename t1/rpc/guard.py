"""Request bodies checked before a servicer sees them: size first, then parse, each failure a status code.

gRPC's own deserialization runs before any T1 code: a body that does not parse ends as UNKNOWN
with a traceback in the log, and a body of any size is parsed before auth rejects it. This
interceptor hands every T1 method its raw bytes instead; it refuses a body over the service's
bound with RESOURCE_EXHAUSTED, parses the rest, and answers INVALID_ARGUMENT naming the method
when the bytes are not its request message. Health and reflection keep their own handlers.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc

T1_PREFIX = "/t1."


async def _parse(raw: bytes, parse: Callable[[bytes], Any] | None, method: str, limit: int | None,
                 context: grpc.aio.ServicerContext) -> Any:
    if limit is not None and len(raw) > limit:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"{method}: request body is {len(raw)} bytes, at most {limit} (limits.max_request_mb)")
    if parse is None:
        return raw
    try:
        return parse(raw)
    except Exception as exc:  # DecodeError and anything else a malformed body raises
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"{method}: request body is not a valid request message ({type(exc).__name__})")


async def _results(result: Any) -> AsyncIterator[Any]:
    if inspect.isasyncgen(result):
        async for item in result:
            yield item
    else:  # a handler that writes its stream through the context and returns
        await result


def guarded(handler: grpc.RpcMethodHandler, method: str, limit: int | None) -> grpc.RpcMethodHandler:
    """The same method with a raw-bytes request path: bounded, parsed here, errors as status codes."""
    parse, ser = handler.request_deserializer, handler.response_serializer

    async def one(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        return await _parse(raw, parse, method, limit, context)

    async def each(raws: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for raw in raws:
            yield await _parse(raw, parse, method, None, context)  # a stream's items: the transport bound only

    if handler.request_streaming and handler.response_streaming:
        async def stream_stream(raws: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for item in _results(handler.stream_stream(each(raws, context), context)):
                yield item
        return grpc.stream_stream_rpc_method_handler(stream_stream, None, ser)
    if handler.request_streaming:
        async def stream_unary(raws: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
            return await handler.stream_unary(each(raws, context), context)
        return grpc.stream_unary_rpc_method_handler(stream_unary, None, ser)
    if handler.response_streaming:
        async def unary_stream(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for item in _results(handler.unary_stream(await one(raw, context), context)):
                yield item
        return grpc.unary_stream_rpc_method_handler(unary_stream, None, ser)

    async def unary_unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        return await handler.unary_unary(await one(raw, context), context)
    return grpc.unary_unary_rpc_method_handler(unary_unary, None, ser)


class RequestGuard(grpc.aio.ServerInterceptor):
    """Wraps every T1 method with `guarded`; `limits` maps a full service name to its request-body bound."""

    def __init__(self, limits: Mapping[str, int | None]) -> None:
        self._limits = dict(limits)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or not method.startswith(T1_PREFIX):
            return handler
        service = method[1:].split("/", 1)[0]
        return guarded(handler, method, self._limits.get(service))
