"""Trackers: every metric of the run, by trainer step and wall time, in TensorBoard and W&B.

The coordinator's registry already holds every metric of docs/design.md (trainer values mirrored from
the trainer's status), and the run log sees every moment worth a point: a `status` record every
few seconds and a `trainer` record whenever the trainer's step moves. So `Trackers` is fed by the
run log (`RunLog(path, trackers)`): at each such record it takes one snapshot of the registry
(plus the trainer's raw step metrics, as `trainer/<key>`) and hands it to every sink, stamped
with the trainer step and the record's wall time.

Sinks are optional extras (`pip install 't1[trackers]'`): TensorBoard event files written with
torch's SummaryWriter under <run_dir>/tensorboard, and W&B under <run_dir>/wandb, offline unless
WANDB_MODE says otherwise (`wandb sync` uploads later). A run without trackers imports neither.
A sink that fails mid-run is logged and dropped: a full disk under the event files must not stop
training, and the JSONL run log still has everything.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Protocol

from prometheus_client import CollectorRegistry

from t1.config.shared import MetricsConfig
from t1.metrics.registry import REGISTRY

log = logging.getLogger(__name__)

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
STEP_KEY = "trainer/step"
_POINT_EVENTS = frozenset({"status", "trainer", "eval"})

WANDB_MODES: dict[str, Literal["online", "offline", "disabled"]] = {
    "online": "online", "offline": "offline", "disabled": "disabled"}
"""The W&B modes T1 accepts from WANDB_MODE (offline by default: no network)."""


class TrackerName(StrEnum):
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"


class TrackerSink(Protocol):
    """Receives one snapshot of scalars at a time; `close` flushes everything to disk."""

    def log(self, scalars: Mapping[str, float], step: int, wall_time: float) -> None: ...

    def close(self) -> None: ...


def _label_tag(name: str, labels: Mapping[str, str]) -> str:
    return "/".join([name, *(f"{k}={v}" for k, v in sorted(labels.items()))])


def registry_scalars(registry: CollectorRegistry = REGISTRY) -> dict[str, float]:
    """Every t1_* sample of a registry as one scalar per tag.

    Gauges and counters keep their family name (`t1_kl`, `t1_rollout_turns`); a labelled child
    adds `/label=value` (`t1_resolve_rate/split=after:heldout`); a histogram gives `<tag>/mean`
    and `<tag>/count`. Non-finite values are left out (TensorBoard would plot them as gaps anyway).
    """
    out: dict[str, float] = {}
    for family in registry.collect():
        if not family.name.startswith("t1_"):
            continue
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        for sample in family.samples:
            tag = _label_tag(family.name, {k: v for k, v in sample.labels.items() if k != "le"})
            suffix = sample.name[len(family.name):]
            if family.type == "histogram":
                if suffix == "_sum":
                    sums[tag] = sample.value
                elif suffix == "_count":
                    counts[tag] = sample.value
            elif suffix in ("", "_total") and math.isfinite(sample.value):
                out[tag] = float(sample.value)
        for tag, count in counts.items():
            out[f"{tag}/count"] = count
            if count > 0:
                out[f"{tag}/mean"] = sums.get(tag, 0.0) / count
    return out


def trainer_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The trainer's raw step metrics as `trainer/<key>` (every key it reports, not only the mirrored ones)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[f"trainer/{key.removeprefix('t1_')}"] = float(value)
    return out


class TensorBoardSink:
    """Scalars into TensorBoard event files, one tag per scalar, x = trainer step, wall time kept per point."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # tensorboard is what is missing: torch is a core dependency
            raise RuntimeError("metrics.trackers lists 'tensorboard' but the tensorboard package is not installed "
                               "(pip install 't1[trackers]')") from exc
        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir), flush_secs=10)

    def log(self, scalars: Mapping[str, float], step: int, wall_time: float) -> None:
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, global_step=step, walltime=wall_time)

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """One W&B run in <dir>; its charts use `trainer/step` as x (W&B records wall time itself)."""

    def __init__(self, directory: Path, name: str, tags: list[str], config: Mapping[str, Any]) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise RuntimeError("metrics.trackers lists 'wandb' but the wandb package is not installed "
                               "(pip install 't1[trackers]')") from exc
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        env_mode = os.environ.get("WANDB_MODE", "offline")
        mode = WANDB_MODES.get(env_mode)
        if mode is None:
            raise RuntimeError(f"WANDB_MODE={env_mode!r}: expected one of {', '.join(WANDB_MODES)}")
        self._run = wandb.init(project="t1", name=name, tags=tags, config=dict(config), dir=str(directory),
                               mode=mode)
        self._run.define_metric(STEP_KEY)
        self._run.define_metric("*", step_metric=STEP_KEY)

    def log(self, scalars: Mapping[str, float], step: int, wall_time: float) -> None:
        self._run.log({**scalars, STEP_KEY: step})

    def close(self) -> None:
        import wandb

        self._run.finish()
        # finish() can return before W&B's service process has written the run file; teardown waits for it
        # (the coordinator has one W&B run: stopping the service here stops nothing else)
        wandb.teardown()


class Trackers:
    """Fed with run-log records; at each status/trainer/eval record every sink gets one registry snapshot."""

    def __init__(self, sinks: list[TrackerSink], registry: CollectorRegistry = REGISTRY) -> None:
        self.sinks = sinks
        self._registry = registry
        self.step = 0
        self._trainer: dict[str, float] = {}
        self.points = 0

    def observe(self, record: Mapping[str, Any]) -> None:
        event = record.get("event")
        if event not in _POINT_EVENTS:
            return
        if event == "trainer":
            self.step = int(record.get("step") or 0)
            self._trainer = trainer_scalars(record.get("metrics") or {})
        elif event == "status" and record.get("trainer_step") is not None:
            self.step = max(self.step, int(record["trainer_step"]))
        scalars = {**registry_scalars(self._registry), **self._trainer}
        wall_time = float(record.get("ts") or 0.0)
        for sink in list(self.sinks):
            try:
                sink.log(scalars, self.step, wall_time)
            except Exception:  # a tracker is a convenience: it never stops the run
                log.exception("tracker %s failed; it is dropped for the rest of the run", type(sink).__name__)
                self.sinks.remove(sink)
        self.points += 1

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:
                log.exception("tracker %s failed to close", type(sink).__name__)
        self.sinks = []


def open_trackers(metrics: MetricsConfig, run_dir: Path, name: str,
                  config: Mapping[str, Any] | None = None) -> Trackers | None:
    """The trackers metrics.trackers names (None when it names none); `config` is recorded by W&B."""
    sinks: list[TrackerSink] = []
    for tracker in dict.fromkeys(TrackerName(t) for t in metrics.trackers):
        if tracker is TrackerName.TENSORBOARD:
            sinks.append(TensorBoardSink(run_dir / TENSORBOARD_DIR))
        else:
            sinks.append(WandbSink(run_dir / WANDB_DIR, name, list(metrics.tags), config or {}))
    return Trackers(sinks) if sinks else None
