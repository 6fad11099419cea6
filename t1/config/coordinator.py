"""Config of the coordinator: its server, run directory, spool, eval jobs and watchdog."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from t1.config.base import Section
from t1.config.shared import ServerConfig


class SpoolConfig(Section):
    """The append-only trajectory spool between rollouts and the trainer."""

    max_mb: int = Field(2048, ge=1, description="Unacknowledged bytes before rollouts are held back.")
    segment_mb: int = Field(64, ge=1, description="Size at which a spool file is rotated.")
    fsync: bool = Field(True, description="fsync each append before it counts as accepted.")
    hold_mb: int = Field(256, ge=1, description="Finished trajectories held in memory while spool writes fail.")


class JournalConfig(Section):
    """Each live episode's turns on disk as they complete (t1/coordinator/spool/journal.py): memory per episode
    that does not grow with its length."""

    enabled: bool = Field(True, description="Journal live episodes; off: each keeps its trajectory arrays in memory.")
    fsync_window_ms: int = Field(
        0, ge=0, description="Sync the journal's file system this often (one syncfs for all episodes: what a machine "
        "crash can lose; it stalls the event loop's own file writes on ext4); 0: the kernel's writeback (a coordinator "
        "crash loses nothing, a machine crash up to vm.dirty_expire_centisecs).")
    max_backlog_mb: int = Field(
        256, ge=1, description="Journal bytes waiting for the disk before episodes wait to start their next turn.")


class EvalConfig(Section):
    """Eval jobs and the final eval of a training run."""

    attempts: int = Field(1, ge=1, description="Attempts per task in the final eval.")
    concurrency: int = Field(16, ge=1, description="Default concurrent attempts per job.")
    before_training: bool = Field(True, description="Also evaluate before training for a before/after report.")
    base_attempts: int | None = Field(
        None, ge=1, description="Attempts per task of the eval before training (the `base` row: a floor, not a "
        "comparison that needs the tightest interval); null: attempts.")
    max_unclean_resumes: int = Field(
        1, ge=0, description="Times an eval job is resumed after the coordinator died while it ran without a "
        "traceback (kill -9, the OOM killer); the next such death marks it failed. A fatal signal's crash fails it at "
        "once.")


class ShardConfig(Section):
    """Which part of the training task stream this coordinator owns (several coordinators, one trainer)."""

    index: int = Field(0, ge=0, description="This coordinator's shard, 0 .. count-1 (a StatefulSet's pod ordinal).")
    count: int = Field(1, ge=1, le=4096, description="How many coordinators share the training tasks.")

    @model_validator(mode="after")
    def _index_in_range(self) -> ShardConfig:
        if self.index >= self.count:
            raise ValueError(f"index {self.index} must be below count {self.count}")
        return self


class CoordinatorConfig(Section):
    """The t1-coordinator process."""

    server: ServerConfig = Field(default_factory=lambda: ServerConfig(port=50051), description="CoordinatorService "
                                                                                               "address.")
    run_dir: Path = Field(Path(".t1/run"), description="Spool, job database, logs and transcripts.")
    runs_dir: Path | None = Field(
        None, description="Parent of numbered training runs <runs_dir>/<name>-<n> (run dir and trainer work dir "
        "inside): an unfinished newest run is resumed, else a fresh one starts; overrides run_dir and "
        "trainer.work_dir.")
    spool: SpoolConfig = Field(default_factory=SpoolConfig, description="Trajectory spool.")
    journal: JournalConfig = Field(default_factory=JournalConfig, description="Per-turn journal of live episodes.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Eval jobs.")
    loop_lag_warn_ms: float = Field(100.0, gt=0, description="Event-loop lag that triggers a slow-callback report.")
    gc_full_interval_s: float = Field(
        300.0, ge=0, description="Full garbage collections run this often instead of automatically; 0 keeps CPython's "
                                 "policy.")
    shutdown_grace_s: float = Field(30.0, ge=0, description="Time given to in-flight episodes on SIGTERM.")
    shutdown_timeout_s: float = Field(
        60.0, gt=0, description="Bound on the whole teardown after the episodes (server, jobs, pools, sandboxes).")
    train: bool = Field(True, description="Run training; false serves eval jobs only.")
    shard: ShardConfig = Field(default_factory=ShardConfig, description="This coordinator's part of the training "
                                                                        "tasks.")
