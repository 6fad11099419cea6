"""Process logging, set up once: human text or one JSON object per line, levels from config.

With a log file (a training run's `<run_dir>/logs/coordinator.log`) every record goes to the file, and
the terminal can be kept quiet (`logging.console`): it then shows warnings and errors, and the records
of the `t1.console` logger (the progress view's stage lines), while per-episode lines and other
progress detail stay in the file. Event-loop lag reports are diagnostics, not faults: below
`LAG_SHOWN_S` they go to the file only (start-up work such as model creation, the toolchain archive or
the heap freeze stalls the loop briefly by design).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from pathlib import Path

from t1.config.shared import LoggingConfig

_CONFIGURED = False
CONSOLE_LOGGER = "t1.console"
WATCHDOG_LOGGER = "t1.metrics.watchdog"
LAG_SHOWN_S = 30.0
_LAG = re.compile(r"event loop lag (\d+) ms")


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


def shown_on_console(record: logging.LogRecord) -> bool:
    """The quiet console's rule: stage lines, and warnings or worse that are not routine lag reports (pure)."""
    if record.name == CONSOLE_LOGGER or record.name.startswith(CONSOLE_LOGGER + "."):
        return True
    if record.levelno < logging.WARNING:
        return False
    if record.name == WATCHDOG_LOGGER and record.levelno == logging.WARNING:
        m = _LAG.match(record.getMessage())
        return m is None or int(m.group(1)) >= LAG_SHOWN_S * 1000
    return True


class QuietConsole(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return shown_on_console(record)


def quiet_console(cfg: LoggingConfig, log_file: Path | None) -> bool:
    """Whether the terminal is kept quiet: `quiet`, or `auto` with a log file and human text (a JSON log is
    read by machines, which want every record on the stream)."""
    if log_file is None:
        return False
    return cfg.console == "quiet" or (cfg.console == "auto" and cfg.format == "text")


class ConsoleFormatter(logging.Formatter):
    """Stage lines (`t1.console`) as they are, every other record in the base format."""

    def __init__(self, base: logging.Formatter) -> None:
        super().__init__()
        self._base = base

    def format(self, record: logging.LogRecord) -> str:
        return record.getMessage() if record.name == CONSOLE_LOGGER else self._base.format(record)


def _formatter(cfg: LoggingConfig, process: str) -> logging.Formatter:
    if cfg.format == "json":
        return JsonFormatter()
    fmt = logging.Formatter(f"%(asctime)s {process} %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    fmt.converter = time.gmtime
    return fmt


def setup_logging(cfg: LoggingConfig | None = None, process: str = "t1", log_file: Path | None = None) -> None:
    """Configure the root logger once per process; later calls only adjust levels. With `log_file`, every
    record is also appended there, and the terminal may be quiet (see the module docstring)."""
    global _CONFIGURED
    cfg = cfg or LoggingConfig()
    root = logging.getLogger()
    if not _CONFIGURED:
        handler = logging.StreamHandler(sys.stderr)
        base = _formatter(cfg, process)
        handler.setFormatter(ConsoleFormatter(base) if cfg.format == "text" else base)
        handlers: list[logging.Handler] = [handler]
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            file_handler = logging.FileHandler(log_file, encoding="utf-8")
            file_handler.setFormatter(_formatter(cfg, process))
            handlers.append(file_handler)
            if quiet_console(cfg, log_file):
                handler.addFilter(QuietConsole())
        root.handlers[:] = handlers
        _CONFIGURED = True
    root.setLevel(cfg.level)
    for name, level in {"asyncssh": "WARNING", "grpc": "WARNING", **cfg.levels}.items():
        logging.getLogger(name).setLevel(level)
