"""The /metrics HTTP endpoint: Prometheus text format from T1's registry, on a background thread."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from t1.metrics.registry import REGISTRY

log = logging.getLogger(__name__)


@dataclass(slots=True)
class MetricsServer:
    """A running endpoint; `port` is the bound port (useful when 0 was asked for)."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_metrics_server(host: str, port: int) -> MetricsServer:
    server, thread = start_http_server(port, addr=host, registry=REGISTRY)
    ms = MetricsServer(server, thread)
    log.info("metrics on http://%s:%d/metrics", host, ms.port)
    return ms
