"""Client side of the gRPC layer: channels with named options, auth metadata, TLS and deadlines."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from t1.config.shared import AuthConfig
from t1.rpc.auth import auth_metadata, client_token
from t1.rpc.options import DEFAULT_DEADLINE_S, channel_options


@dataclass(frozen=True, slots=True)
class CallOptions:
    """Metadata and a deadline for every call; callers pass `**opts.kw()` or `**opts.kw(timeout)`."""

    metadata: tuple[tuple[str, str], ...] = ()
    deadline_s: float = DEFAULT_DEADLINE_S

    def kw(self, timeout_s: float | None = None) -> dict[str, object]:
        return {"metadata": self.metadata, "timeout": self.deadline_s if timeout_s is None else timeout_s}


def make_channel(target: str, auth: AuthConfig | None = None) -> grpc.aio.Channel:
    """An asyncio channel to host:port, TLS when the config says so."""
    auth = auth or AuthConfig()
    if auth.tls.enabled:
        root = auth.tls.ca_file.read_bytes() if auth.tls.ca_file else None
        return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root), options=channel_options())
    return grpc.aio.insecure_channel(target, options=channel_options())


def make_sync_channel(target: str, auth: AuthConfig | None = None) -> grpc.Channel:
    """A blocking channel, for CLI tools and scripts."""
    auth = auth or AuthConfig()
    if auth.tls.enabled:
        root = auth.tls.ca_file.read_bytes() if auth.tls.ca_file else None
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(root), options=channel_options())
    return grpc.insecure_channel(target, options=channel_options())


def call_options(auth: AuthConfig | None = None, deadline_s: float = DEFAULT_DEADLINE_S) -> CallOptions:
    return CallOptions(metadata=auth_metadata(client_token(auth or AuthConfig())), deadline_s=deadline_s)
