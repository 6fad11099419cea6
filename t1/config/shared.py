"""Config of what every process shares: auth, TLS, logging, metrics, server addresses."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from t1.config.base import Section

_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?$")


def host_port(value: str) -> str:
    """`value` when it is a gRPC address `host:port` (a name, an IPv4 address or a bracketed IPv6 one, a port
    in 1-65535), else ValueError saying what is wrong with it (pure)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{value!r}: expected host:port")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{value!r}: the port must be a number in 1-65535")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{value!r}: {host} is not an IPv6 address") from None
    elif not _HOSTNAME.match(host):
        raise ValueError(f"{value!r}: {host!r} is not a host name or address (letters, digits, '.', '-', '_'; "
                         "an IPv6 address in brackets)")
    return value


class TlsConfig(Section):
    """Optional TLS for gRPC servers and clients, from PEM files."""

    enabled: bool = Field(False, description="Serve and connect with TLS instead of plaintext.")
    cert_file: Path | None = Field(None, description="PEM certificate chain of this server.")
    key_file: Path | None = Field(None, description="PEM private key of this server.")
    ca_file: Path | None = Field(None, description="PEM root certificates clients trust.")

    @model_validator(mode="after")
    def _files_when_enabled(self) -> TlsConfig:
        if self.enabled and (self.cert_file is None or self.key_file is None):
            raise ValueError("tls.enabled needs cert_file and key_file")
        return self


class AuthConfig(Section):
    """Bearer-token auth on every gRPC call."""

    token: str | None = Field(None, description="Shared bearer token; null means read token_env.")
    token_env: str = Field("T1_API_TOKEN", description="Environment variable holding the token.")
    tls: TlsConfig = Field(default_factory=TlsConfig, description="TLS settings.")


class LoggingConfig(Section):
    """Process logging, set up once at start."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Root log level.")
    format: Literal["text", "json"] = Field("text", description="Human text or one JSON object per line.")
    console: Literal["auto", "quiet", "all"] = Field(
        "auto", description="With a log file (a training run's <run_dir>/logs/coordinator.log): quiet shows only "
        "stage lines and warnings on the terminal, all shows every record; auto is quiet for text logs.")
    levels: dict[str, Literal["DEBUG", "INFO", "WARNING", "ERROR"]] = Field(
        default_factory=dict, description="Per-logger levels, e.g. {'asyncssh': 'WARNING'}."
    )


class MetricsConfig(Section):
    """Prometheus metrics and the JSONL run log."""

    port: int | None = Field(9400, ge=0, le=65535, description="HTTP port for /metrics; null disables, 0 picks a free "
                                                               "port.")
    host: str = Field("127.0.0.1", description="Address the metrics endpoint binds.")
    run_log: Path | None = Field(None, description="JSONL run log path; default <run_dir>/run.jsonl.")
    trackers: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list,
        description="Also write every metric to these: TensorBoard (<run_dir>/tensorboard), W&B (<run_dir>/wandb, "
                    "offline "
                    "unless WANDB_MODE says otherwise); extra `trackers`.")
    tags: list[str] = Field(default_factory=list, description="Tags of the run in the trackers (the run name is "
                                                              "`name`).")


class ServerConfig(Section):
    """Where a gRPC service listens."""

    host: str = Field("127.0.0.1", description="Bind address.")
    port: int = Field(0, ge=0, le=65535, description="Port; 0 picks a free one.")
    grace_s: float = Field(5.0, ge=0, description="Grace period for in-flight calls on shutdown.")
    max_message_mb: int = Field(256, ge=1, le=2047, description="Largest gRPC message accepted or sent.")
