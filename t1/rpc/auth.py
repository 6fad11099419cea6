"""Bearer-token auth: a server interceptor that rejects calls without the token, and client metadata.

Besides the configured token (`auth.token` or its environment variable), a local run gives the
child services it starts (inference servers, the trainer) a generated service token in
`SERVICE_TOKEN_ENV`: they require it when no token is configured, and the coordinator's clients
(`use_service_token`) and the children's own clients send it, so nothing else on the machine
can call UpdateWeights or PushTrajectories. The coordinator's own server is not given it.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from t1.config.shared import AuthConfig

# Health checks stay open so load balancers and Kubernetes probes need no secret.
OPEN_METHODS_PREFIXES = ("/grpc.health.v1.Health/",)


SERVICE_TOKEN_ENV = "T1_SERVICE_TOKEN"
_service_token: str | None = None


def use_service_token(token: str) -> None:
    """Send `token` from this process's clients when no token is configured (the coordinator of a local run)."""
    global _service_token
    _service_token = token


def server_token(auth: AuthConfig) -> str | None:
    """The token a server requires: the configured one, else the service token its parent gave it."""
    return resolve_token(auth) or os.environ.get(SERVICE_TOKEN_ENV, "").strip() or None


def client_token(auth: AuthConfig) -> str | None:
    """The token a client sends: the configured one, else the local run's service token."""
    return resolve_token(auth) or _service_token or os.environ.get(SERVICE_TOKEN_ENV, "").strip() or None


def resolve_token(auth: AuthConfig) -> str | None:
    """The token from config, else from the configured environment variable, else None (auth off)."""
    if auth.token:
        return auth.token
    value = os.environ.get(auth.token_env, "").strip()
    return value or None


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def _reject(message: str) -> _Handler:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - makes this an async generator

    return _Handler(unary, stream)


class _Handler:
    """Builds a handler of the same cardinality as the intercepted method."""

    def __init__(self, unary: Callable[..., Awaitable[Any]], stream: Callable[..., Any]) -> None:
        self.unary = unary
        self.stream = stream

    def like(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        des, ser = None, handler.response_serializer  # the rejected body stays raw bytes: it is never parsed
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(self.stream, des, ser)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(self.unary, des, ser)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(self.stream, des, ser)
        return grpc.unary_unary_rpc_method_handler(self.unary, des, ser)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects with UNAUTHENTICATED every call that lacks `authorization: Bearer <token>`."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method or ""
        handler = await continuation(handler_call_details)
        if handler is None or method.startswith(OPEN_METHODS_PREFIXES):
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = metadata.get("authorization", "")
        given_bytes = given.encode() if isinstance(given, str) else bytes(given)
        if hmac.compare_digest(given_bytes, self._expected):
            return handler
        reason = "missing bearer token" if not given else "invalid bearer token"
        return _reject(reason).like(handler)
