"""One gRPC server layer for every T1 service: health, reflection, auth, TLS and graceful shutdown."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from t1.config.shared import AuthConfig, ServerConfig
from t1.errors import BadRequest
from t1.rpc.auth import BearerTokenInterceptor, server_token
from t1.rpc.guard import RequestGuard
from t1.rpc.options import MB, server_options

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceBinding:
    """A servicer and the generated function that adds it to a server."""

    name: str                                   # full service name, e.g. "t1.v1.InferenceService"
    add_to_server: Callable[[Any, grpc.aio.Server], None]
    servicer: Any
    max_request_bytes: int | None = None        # bound on unary request bodies (None: the transport's only)


def _credentials(auth: AuthConfig) -> grpc.ServerCredentials | None:
    tls = auth.tls
    if not tls.enabled:
        return None
    assert tls.cert_file is not None and tls.key_file is not None
    root = tls.ca_file.read_bytes() if tls.ca_file else None
    return grpc.ssl_server_credentials(
        [(tls.key_file.read_bytes(), tls.cert_file.read_bytes())], root_certificates=root,
        require_client_auth=False,
    )


class UnprotectedServer(BadRequest, ValueError):
    """A server without auth asked to listen beyond loopback."""


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches: 127.0.0.0/8, ::1, localhost (pure)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name other than localhost, or "" (every interface)
        return False


class GrpcServer:
    """An asyncio gRPC server hosting T1 services plus grpc.health.v1 and reflection."""

    def __init__(self, bindings: Sequence[ServiceBinding], server: ServerConfig, auth: AuthConfig) -> None:
        self._bindings = tuple(bindings)
        self._cfg = server
        self._auth = auth
        self._server: grpc.aio.Server | None = None
        self._health = HealthServicer()
        self.port: int | None = None

    @property
    def address(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"{self._cfg.host}:{self.port}"

    async def start(self) -> int:
        token = server_token(self._auth)
        if token is None and not is_loopback(self._cfg.host):
            raise UnprotectedServer(
                f"refusing to serve gRPC on {self._cfg.host} without auth: anyone who reaches it could submit "
                f"jobs, aim them at any endpoint and load weights; set auth.token or ${self._auth.token_env}, "
                "or bind a loopback address (server host 127.0.0.1)")
        # The guard is innermost: auth rejects before any body is parsed, the guard parses the rest.
        guard = RequestGuard({b.name: b.max_request_bytes for b in self._bindings})
        interceptors: list[grpc.aio.ServerInterceptor] = [BearerTokenInterceptor(token), guard] if token else [guard]
        server = grpc.aio.server(interceptors=interceptors, options=server_options(self._cfg.max_message_mb * MB))
        for binding in self._bindings:
            binding.add_to_server(binding.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        names = [b.name for b in self._bindings]
        reflection.enable_server_reflection([*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                              reflection.SERVICE_NAME], server)
        target = f"{self._cfg.host}:{self._cfg.port}"
        creds = _credentials(self._auth)
        port = server.add_secure_port(target, creds) if creds else server.add_insecure_port(target)
        if port == 0:
            raise OSError(f"cannot bind gRPC server to {target}")
        await server.start()
        for name in ["", *names]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._server, self.port = server, port
        log.info("gRPC server on %s:%d serving %s (auth %s, tls %s)", self._cfg.host, port, ", ".join(names),
                 "on" if token else "off", "on" if creds else "off")
        if token is None:
            log.warning("gRPC server on %s:%d has no auth: any user of this machine can call it; set auth.token "
                        "or $%s to require a token", self._cfg.host, port, self._auth.token_env)
        return port

    async def stop(self, grace_s: float | None = None) -> None:
        """Mark NOT_SERVING, then let in-flight calls finish within the grace period."""
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        await self._server.stop(self._cfg.grace_s if grace_s is None else grace_s)
        self._server = None

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()
