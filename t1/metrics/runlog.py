"""The JSONL run log: one JSON object per line with a timestamp and an event name, flushed per line.

Trackers (TensorBoard, W&B; t1/metrics/trackers.py) hang off the run log: every record written is
also offered to them, so they see the same moments the log does.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from t1.metrics.trackers import Trackers


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


class RunLog:
    """Append-only; a line is a complete JSON object, so a crash never leaves half a record parsed."""

    def __init__(self, path: Path, trackers: Trackers | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.trackers = trackers
        self._file: IO[str] | None = path.open("a", encoding="utf-8")

    def write(self, event: str, **fields: Any) -> None:
        if self._file is None:
            return
        record = {"ts": round(time.time(), 3), "event": event, **_clean(fields)}
        self._file.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
        self._file.flush()
        if self.trackers is not None:
            self.trackers.observe(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.trackers is not None:
            self.trackers.close()


def read_run_log(path: Path) -> list[dict[str, Any]]:
    """Every record of a run log (for reports and tests)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
