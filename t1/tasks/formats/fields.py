"""Typed reads from a parsed task file, with errors that name the file, the field and the problem.

Task formats grow fields faster than T1 does, so keys T1 does not use are ignored;
keys it does use must have the right type.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from t1.tasks.spec import Env, Healthcheck, TaskParseError, env_tuple

_MISSING = object()
# A healthcheck runs during setup, before any episode deadline: its worst case must stay bounded.
HEALTHCHECK_MAX_RETRIES = 1000
HEALTHCHECK_MAX_SEC = 3600.0


class Fields:
    """A mapping read from `file` under the dotted `prefix` (e.g. 'environment')."""

    def __init__(self, file: Path, data: Any, prefix: str = "") -> None:
        if not isinstance(data, dict):
            raise TaskParseError(file, prefix or "<root>", f"expected a table/mapping, got {type(data).__name__}")
        self.file = file
        self.data = data
        self.prefix = prefix

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, problem: str) -> TaskParseError:
        return TaskParseError(self.file, self.name(key), problem)

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def table(self, key: str) -> Fields:
        value = self.data.get(key)
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self.error(key, f"expected a table, got {type(value).__name__}")
        return Fields(self.file, value, self.name(key))

    def text(self, key: str, default: Any = _MISSING) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise self.error(key, "required field is missing")
            return default
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {type(value).__name__} {value!r}")
        return value

    def number(self, key: str, default: Any = _MISSING, positive: bool = True, maximum: float | None = None) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise self.error(key, "required field is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"expected a number, got {type(value).__name__} {value!r}")
        if not math.isfinite(value):  # inf would disable a deadline, NaN fails every comparison
            raise self.error(key, f"must be a finite number, got {value!r}")
        if positive and value <= 0:
            raise self.error(key, f"must be > 0, got {value!r}")
        if maximum is not None and value > maximum:
            raise self.error(key, f"must be <= {maximum:g}, got {value!r}")
        return float(value)

    def integer(self, key: str, default: Any = _MISSING, positive: bool = True, maximum: int | None = None) -> Any:
        value = self.number(key, default, positive=positive, maximum=maximum)
        if value is None:
            return None
        if value != int(value):
            raise self.error(key, f"expected a whole number, got {value!r}")
        return int(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def str_list(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, f"expected a list of strings, got {value!r}")
        return tuple(value)

    def env(self, key: str) -> Env:
        value = self.data.get(key) or {}
        if not isinstance(value, dict):
            raise self.error(key, f"expected a table of NAME = value, got {type(value).__name__}")
        for k, v in value.items():
            if not isinstance(v, (str, int, float, bool)):
                raise self.error(f"{key}.{k}", f"expected a string or number, got {type(v).__name__}")
        return env_tuple(value)

    def healthcheck(self, key: str) -> Healthcheck | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, str):
            return Healthcheck(command=value)
        hc = self.table(key)
        return Healthcheck(
            command=hc.text("command"),
            interval_sec=hc.number("interval_sec", 5.0, positive=False, maximum=HEALTHCHECK_MAX_SEC),
            timeout_sec=hc.number("timeout_sec", 30.0, maximum=HEALTHCHECK_MAX_SEC),
            retries=max(1, hc.integer("retries", 3, maximum=HEALTHCHECK_MAX_RETRIES)),
            start_period_sec=hc.number("start_period_sec", 0.0, positive=False, maximum=HEALTHCHECK_MAX_SEC),
            start_interval_sec=hc.number("start_interval_sec", 5.0, positive=False, maximum=HEALTHCHECK_MAX_SEC),
        )


def read_text(path: Path, what: str = "<file>") -> str:
    """A UTF-8 text file, or a TaskParseError naming it."""
    if not path.is_file():
        raise TaskParseError(path, what, "file is missing")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TaskParseError(path, what, "not UTF-8 text") from None
