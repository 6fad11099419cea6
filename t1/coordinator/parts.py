"""Parts: the coordinator's long-lived components, built from config and closed in the order app.py documents."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from t1.config.schema import T1Config
from t1.coordinator.evals import EvalJobs
from t1.coordinator.jobs import JobStore
from t1.coordinator.progress import EvalProgress, ProgressView
from t1.coordinator.rollout import RolloutRunner
from t1.coordinator.runtime import GenerateRouter, make_renderers
from t1.coordinator.scheduler import Scheduler
from t1.coordinator.service import CoordinatorServicer
from t1.coordinator.spool import Spool
from t1.coordinator.status import TrainerStatusPoller, TurnRate, run_status
from t1.coordinator.tasksource import make_resolver
from t1.coordinator.trainer_link import TrainerLink, stop_task
from t1.coordinator.weights import WeightSync
from t1.metrics import registry as m
from t1.metrics.http import MetricsServer, start_metrics_server
from t1.metrics.runlog import RunLog
from t1.metrics.trackers import open_trackers
from t1.rpc.server import GrpcServer
from t1.sandbox.factory import build_provider
from t1.sandbox.pool import SandboxPool
from t1.sandbox.types import SandboxProvider
from t1.v1 import coordinator_pb2 as cpb

log = logging.getLogger(__name__)
MB = 1 << 20
ADDRESS_FILE = "coordinator.json"


@dataclass(eq=False)
class Parts:
    cfg: T1Config
    run_dir: Path
    runlog: RunLog
    metrics: MetricsServer | None
    provider: SandboxProvider
    sandboxes: SandboxPool
    router: GenerateRouter
    runner: RolloutRunner
    limiter: asyncio.Semaphore
    spool: Spool
    store: JobStore
    evals: EvalJobs
    server: GrpcServer
    stage: str = "starting"
    address: str = ""
    link: TrainerLink | None = None
    weights: WeightSync | None = None
    poller: TrainerStatusPoller | None = None
    scheduler: Scheduler | None = None
    turn_rate: TurnRate | None = None
    eval_job: tuple[str, str] | None = None  # (label, job id) of the run's eval stage in progress
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _progress: asyncio.Task[None] | None = None

    @classmethod
    async def build(cls, cfg: T1Config, run_dir: Path, endpoints: list[str]) -> Parts:
        run_dir.mkdir(parents=True, exist_ok=True)
        runlog = RunLog(cfg.metrics.run_log or run_dir / "run.jsonl",
                        open_trackers(cfg.metrics, run_dir, cfg.name, cfg.model_dump(mode="json")))
        metrics = start_metrics_server(cfg.metrics.host, cfg.metrics.port) if cfg.metrics.port is not None else None
        renderers = await asyncio.to_thread(make_renderers, cfg.inference.model.path)
        provider = build_provider(cfg.sandbox)
        sandboxes = SandboxPool(provider, cfg.sandbox.pool)
        router = GenerateRouter(cfg, renderers)
        if endpoints:
            router.connect(endpoints)
        runner = RolloutRunner(cfg, renderers, sandboxes.acquire, router, run_dir / "transcripts",
                               local=cfg.sandbox.provider == "local", plan=router.plan)
        limiter = asyncio.Semaphore(cfg.rollout.max_concurrent_episodes)
        sp = cfg.coordinator.spool
        spool = Spool.open(run_dir / "spool", sp.max_mb * MB, sp.segment_mb * MB, sp.fsync)
        store = JobStore(run_dir / "jobs.db")
        evals = EvalJobs(store, make_resolver(cfg.tasks), runner.as_attempt_runner(), cfg.coordinator.eval.concurrency,
                         limiter)
        parts = cls(cfg, run_dir, runlog, metrics, provider, sandboxes, router, runner, limiter, spool, store, evals,
                    server=None)  # type: ignore[arg-type]
        servicer = CoordinatorServicer(evals, parts.run_status)
        parts.server = GrpcServer([servicer.binding()], cfg.coordinator.server, cfg.auth)
        parts.turn_rate = TurnRate(lambda: runner.stats.turns)
        return parts

    def _spawn(self, coro, name: str) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(coro, name=name))

    async def start_services(self) -> None:
        """gRPC server up (address written to <run_dir>/coordinator.json), unfinished eval jobs resumed."""
        await self.server.start()
        self.address = self.server.address
        (self.run_dir / ADDRESS_FILE).write_text(json.dumps({"address": self.address, "pid": os.getpid()}) + "\n")
        self.runlog.write("start", address=self.address, name=self.cfg.name,
                          metrics_port=self.metrics.port if self.metrics else None)
        self.evals.resume()
        self._spawn(self._tick(), "status-ticker")

    def show_progress(self) -> None:
        ws = self.cfg.trainer.warm_start
        total = ws.sft_steps + ws.critic_warmup_steps + self.cfg.trainer.max_steps if self.cfg.coordinator.train else 0
        self._spawn(ProgressView(self.run_status, self.current_eval, total).run(), "progress")
        self._progress = self._tasks[-1]

    async def hide_progress(self) -> None:
        """Stop the live display (before the final report is printed)."""
        if self._progress is not None:
            await stop_task(self._progress)

    def current_eval(self) -> EvalProgress | None:
        if self.eval_job is None:
            return None
        label, job_id = self.eval_job
        record = self.store.get(job_id)
        if record is None:
            return None
        return EvalProgress(label, len(self.store.finished_keys(job_id)), record.total_attempts)

    def connect_trainer(self, target: str) -> None:
        """Trainer link, weight sync and status poller against the trainer at `target`."""
        self.link = TrainerLink(self.spool, target, self.cfg.auth)
        self.weights = WeightSync(target, self._load_weights, self.cfg.auth)
        self.poller = TrainerStatusPoller(target, self.runlog, self.cfg.auth)
        self._spawn(self.link.run(), "trainer-link")
        self._spawn(self.weights.run(), "weight-sync")
        self._spawn(self.poller.run(), "trainer-status")

    async def _load_weights(self, path: str, version: int) -> None:
        pool = self.router.pool
        if pool is not None:
            await pool.update_weights(path, version)
        if self.router.scripted is not None:
            self.router.scripted.policy_version = version
        self.runlog.write("weights", version=version, path=path)

    async def _tick(self, every_s: float = 5.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            assert self.turn_rate is not None
            rate = self.turn_rate.sample()
            st = self.run_status()
            self.runlog.write("status", stage=st.stage, active=st.active_episodes, finished=st.finished_episodes,
                              turns_per_s=round(rate, 3), spool_pending=st.spool_pending, version=st.policy_version,
                              trainer_step=st.trainer_step, infra_failure_rate=st.infra_failure_rate)

    def run_status(self) -> cpb.RunStatus:
        stats = self.runner.stats
        return run_status(
            name=self.cfg.name, stage=self.stage, version=self.weights.version if self.weights else 0,
            trainer=self.poller, active=int(m.ACTIVE_EPISODES._value.get()), finished=stats.finished,
            spool_pending=self.spool.pending_count, spool_bytes=self.spool.pending_bytes,
            trainer_connected=bool(self.link and self.link.connected),
            healthy_servers=len(self.router.pool.healthy_endpoints) if self.router.pool is not None else 0,
            infra_rate=stats.infra_errors / stats.finished if stats.finished else 0.0,
            turns_per_s=self.turn_rate.sample() if self.turn_rate else 0.0)

    async def close(self, grace_s: float) -> None:
        """Steps 3-7 of app.py's shutdown order (the caller has stopped and drained the scheduler)."""
        if self.scheduler is not None:
            self.scheduler.stop()
        await self.server.stop(self.cfg.coordinator.server.grace_s)
        await self.evals.close()
        for task in reversed(self._tasks):
            await stop_task(task)
        self.spool.close()
        self.store.close()
        await self.router.close()
        await self.sandboxes.close()  # destroys sandboxes still out, then closes the provider
        self.runlog.write("stop", spool_pending=self.spool.pending_count)
        if self.metrics is not None:
            self.metrics.stop()
        self.runlog.close()
