"""Status codes for bad requests: validation errors become INVALID_ARGUMENT naming the field;
state the server lacks for a request (FailedPrecondition) becomes FAILED_PRECONDITION; a bound on what it
holds (ResourceExhausted) becomes RESOURCE_EXHAUSTED."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from t1.errors import BadRequest

F = TypeVar("F", bound=Callable[..., Any])


class RequestError(BadRequest, ValueError):
    """A request field is missing or malformed; str(self) names the field."""


class NotFound(BadRequest, LookupError):
    """The request names something that does not exist."""


class FailedPrecondition(BadRequest):
    """The request is well formed but needs state this server does not hold (the caller can resend)."""


class ResourceExhausted(BadRequest):
    """A bound on what the server holds is reached (active jobs, stored bytes); str(self) names the bound."""


# What the servicers map to a status code: everything status_for knows.
REQUEST_ERRORS = (ValueError, NotFound, FailedPrecondition, ResourceExhausted)


def status_for(exc: BaseException) -> grpc.StatusCode | None:
    if isinstance(exc, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, FailedPrecondition):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(exc, ResourceExhausted):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, ValueError):  # RequestError, TensorError
        return grpc.StatusCode.INVALID_ARGUMENT
    return None


def rpc_errors(method: F) -> F:
    """Map RequestError/ValueError to INVALID_ARGUMENT, NotFound to NOT_FOUND and FailedPrecondition to
    FAILED_PRECONDITION, for unary and streaming methods."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                async for item in method(self, request, context):
                    yield item
            except REQUEST_ERRORS as exc:
                code = status_for(exc)
                assert code is not None
                await context.abort(code, str(exc))

        return stream  # type: ignore[return-value]

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except REQUEST_ERRORS as exc:
            code = status_for(exc)
            assert code is not None
            await context.abort(code, str(exc))

    return unary  # type: ignore[return-value]
