"""Process logging, set up once: human text or one JSON object per line, levels from config."""

from __future__ import annotations

import json
import logging
import sys
import time

from t1.config.service import LoggingConfig

_CONFIGURED = False


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        for key, value in getattr(record, "fields", {}).items():
            payload[key] = value
        return json.dumps(payload, default=str)


def setup_logging(cfg: LoggingConfig | None = None, process: str = "t1") -> None:
    """Configure the root logger once per process; later calls only adjust levels."""
    global _CONFIGURED
    cfg = cfg or LoggingConfig()
    root = logging.getLogger()
    if not _CONFIGURED:
        handler = logging.StreamHandler(sys.stderr)
        if cfg.format == "json":
            handler.setFormatter(JsonFormatter())
        else:
            fmt = logging.Formatter(f"%(asctime)s {process} %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
            fmt.converter = time.gmtime
            handler.setFormatter(fmt)
        root.handlers[:] = [handler]
        _CONFIGURED = True
    root.setLevel(cfg.level)
    for name, level in {"asyncssh": "WARNING", "grpc": "WARNING", **cfg.levels}.items():
        logging.getLogger(name).setLevel(level)
