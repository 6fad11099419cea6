"""The JSONL run log: one JSON object per line with a timestamp and an event name, flushed per line.

Trackers (TensorBoard, W&B; t1/metrics/trackers.py) hang off the run log: every record written is
also offered to them, so they see the same moments the log does.

A write that fails (a full disk) is cut back to the last whole line and the log stops writing:
the records of the next RETRY_S are dropped, none is half written, the run goes on and
`write_error` (and WriteFaults, when given) says why; then the next record tries again. Trackers
still see every record.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from t1.metrics.trackers import Trackers
    from t1.metrics.write_faults import WriteFaults

RETRY_S = 10.0


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

    def __init__(self, path: Path, trackers: Trackers | None = None, faults: WriteFaults | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.trackers = trackers
        self.write_error = ""
        self._faults = faults
        self._what = f"run log {path}"
        self._retry_at = 0.0
        self._file: BinaryIO | None = path.open("ab", buffering=0)
        self._size = self._file.seek(0, 2)

    def write(self, event: str, **fields: Any) -> None:
        record = {"ts": round(time.time(), 3), "event": event, **_clean(fields)}
        if self._file is None and self.write_error and time.monotonic() >= self._retry_at:
            self._reopen()
        if self._file is not None:
            line = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
            try:
                if self._file.write(line) != len(line):
                    raise OSError(f"short write of {len(line)} bytes (the disk is full?)")
                self._size += len(line)
            except OSError as exc:
                self._stop(exc)
            else:
                if self.write_error:
                    self.write_error = ""
                    if self._faults is not None:
                        self._faults.recovered(self._what)
        if self.trackers is not None:
            self.trackers.observe(record)

    def _reopen(self) -> None:
        try:
            self._file = self.path.open("ab", buffering=0)
            self._size = self._file.seek(0, 2)
        except OSError:
            self._retry_at = time.monotonic() + RETRY_S

    def _stop(self, exc: OSError) -> None:
        assert self._file is not None
        with contextlib.suppress(OSError):
            self._file.truncate(self._size)  # no half line: every line of the file stays a whole record
        self._file.close()
        self._file = None
        self.write_error = f"{self.path}: {exc}"
        self._retry_at = time.monotonic() + RETRY_S
        if self._faults is not None:
            self._faults.failed(self._what, exc)

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        if self.trackers is not None:
            self.trackers.close()


