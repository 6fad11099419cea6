"""Parts: the coordinator's long-lived components, built complete from config and closed in app.py's order.

`Parts` is frozen: nothing is attached to it after `build`. What changes while the run goes is
in `RunState` (written by the driver only); the trainer side is made by `connect_trainer`, which
returns it. Background loops (status ticker, progress, trainer link, weight sync, status poller)
are owned by `Background` and cancelled at close. `close(timeout_s)` bounds the whole teardown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t1.config.schema import T1Config
from t1.coordinator.evals.crash import CrashWatch, ExitKind
from t1.coordinator.evals.eval_jobs import EvalJobs
from t1.coordinator.evals.job_store import JobStore
from t1.coordinator.evals.service import CoordinatorServicer
from t1.coordinator.model_setup import make_renderers
from t1.coordinator.rollout.generate_router import GenerateRouter
from t1.coordinator.rollout.runner import RolloutRunner, new_group_id
from t1.coordinator.rollout.scheduler import Scheduler
from t1.coordinator.run.progress import EvalProgress, ProgressView
from t1.coordinator.run.run_state import RunState, TrainerSide
from t1.coordinator.run.run_status import RunStatusReader
from t1.coordinator.spool.journal import Journal
from t1.coordinator.spool.journal_recovery import Recovered, recover
from t1.coordinator.spool.trajectory_spool import Spool
from t1.coordinator.tasksource import make_resolver
from t1.coordinator.trainer_side.status import TrainerStatusPoller, TurnRate
from t1.coordinator.trainer_side.trainer_link import TrainerLink
from t1.coordinator.trainer_side.weights import WeightSync
from t1.errors import T1Error
from t1.metrics.http import MetricsServer, start_metrics_server
from t1.metrics.runlog import RunLog
from t1.metrics.trackers import open_trackers
from t1.metrics.write_faults import WriteFaults
from t1.rpc.server import GrpcServer
from t1.sandbox.factory import build_provider
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.loopback_port import SandboxPorts
from t1.sandbox.pool import SandboxPool
from t1.sandbox.types import SandboxProvider, SweepsUnclaimed
from t1.tasks.image.docker_build import EnvironmentBuilder

log = logging.getLogger(__name__)
MB = 1 << 20
ADDRESS_FILE = "coordinator.json"
STATUS_EVERY_S = 5.0
STAGE_CHECK_S = 0.5


class BackgroundFailed(T1Error, RuntimeError):
    """A background loop ended with an error: the run cannot go on without it."""

    def __init__(self, name: str, error: BaseException) -> None:
        super().__init__(f"background loop {name} failed: {type(error).__name__}: {error}")
        self.name = name
        self.error = error


class Background:
    """The coordinator's background loops: started by name, each watched, all cancelled together at stop.

    A loop runs until it is cancelled. One that ends with an error is logged and reported to
    `on_failure` (the driver stops the run with that error): nothing waits forever for a dead loop.
    `stop()` cancels every loop and waits for all of them; the errors they ended with are logged
    and returned, never raised, so the teardown after it always runs."""

    def __init__(self, on_failure: Callable[[BackgroundFailed], None] | None = None) -> None:
        self._tasks: list[asyncio.Task[None]] = []
        self._on_failure = on_failure
        self._stopping = False
        self.failures: list[BackgroundFailed] = []

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(self._ended)
        self._tasks.append(task)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or (err := task.exception()) is None:
            return
        if self._stopping:
            return  # stop() collects and logs what the loops ended with
        failed = BackgroundFailed(task.get_name(), err)
        self.failures.append(failed)
        log.error("%s: the run stops", failed, exc_info=err)
        if self._on_failure is not None:
            self._on_failure(failed)

    @property
    def running(self) -> list[str]:
        return [t.get_name() for t in self._tasks if not t.done()]

    async def stop(self) -> list[BackgroundFailed]:
        """Cancel every loop and wait for all of them; returns the failures of the loops (also logged)."""
        self._stopping = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        reported = {id(f.error) for f in self.failures}
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, Exception) and id(result) not in reported:
                self.failures.append(failed := BackgroundFailed(task.get_name(), result))
                log.error("%s (while stopping)", failed)
        return list(self.failures)


def open_spool(cfg: T1Config, run_dir: Path) -> Spool:
    """The run's trajectory spool in <run_dir>/spool, sized and synced as `coordinator.spool` says."""
    sp = cfg.coordinator.spool
    return Spool.open(run_dir / "spool", sp.max_mb * MB, sp.segment_mb * MB, sp.fsync, sp.hold_mb * MB)


def open_journal(cfg: T1Config, run_dir: Path) -> Journal | None:
    """The per-turn journal of live episodes in <run_dir>/journal (None when `coordinator.journal` is off)."""
    jc = cfg.coordinator.journal
    return Journal.open(run_dir / "journal", jc.fsync_window_ms / 1000, jc.max_backlog_mb * MB) if jc.enabled else None


def make_scheduler(cfg: T1Config, limiter: asyncio.Semaphore, spool: Spool) -> Scheduler:
    """The one Scheduler of a run: groups of `rollout.group_size` under `limiter`, paced by `trainer.rl`."""
    rl = cfg.trainer.rl
    shard = cfg.coordinator.shard
    return Scheduler(cfg.rollout.group_size, limiter, spool, rl.max_policy_lag, rl.groups_per_step,
                     lambda task: new_group_id(task, shard))


@dataclass(frozen=True, eq=False)
class Parts:
    cfg: T1Config
    run_dir: Path
    state: RunState
    runlog: RunLog
    metrics: MetricsServer | None
    provider: SandboxProvider
    sandboxes: SandboxPool
    router: GenerateRouter
    runner: RolloutRunner
    limiter: asyncio.Semaphore
    spool: Spool
    journal: Journal | None
    store: JobStore
    evals: EvalJobs
    scheduler: Scheduler
    turn_rate: TurnRate
    run_status: RunStatusReader
    server: GrpcServer
    background: Background
    crash_watch: CrashWatch
    recovered: Recovered  # what start-up found in the journal; its `unfinished` episodes the training stage resumes

    @classmethod
    async def build(cls, cfg: T1Config, run_dir: Path, endpoints: list[str], state: RunState,
                    on_failure: Callable[[BackgroundFailed], None] | None = None) -> Parts:
        """The parts, built; `on_failure` hears of a background loop that died (the driver stops the run)."""
        run_dir.mkdir(parents=True, exist_ok=True)
        faults = WriteFaults()
        runlog = RunLog(cfg.metrics.run_log or run_dir / "run.jsonl",
                        open_trackers(cfg.metrics, run_dir, cfg.name, cfg.model_dump(mode="json")), faults)
        metrics = start_metrics_server(cfg.metrics.host, cfg.metrics.port) if cfg.metrics.port is not None else None
        renderers = await asyncio.to_thread(make_renderers, cfg.inference.model.path, cfg.rollout.tool_schemas,
                                              cfg.inference.model.chat_template_kwargs)
        provider = build_provider(cfg.sandbox, run_dir, images=EnvironmentBuilder)
        sandboxes = SandboxPool(provider, cfg.sandbox.pool)
        router = GenerateRouter(cfg, renderers)
        if endpoints:
            router.connect(endpoints)
        if cfg.coordinator.train:
            await router.check_trainable()
        journal = open_journal(cfg, run_dir)
        runner = RolloutRunner(
            cfg,
            renderers,
            sandboxes.acquire,
            router,
            run_dir / "transcripts",
            sandboxes=provider.traits,
            journal=journal,
            faults=faults,
            ports=provider if isinstance(provider, SandboxPorts) else None,
        )
        limiter = asyncio.Semaphore(cfg.rollout.max_concurrent_episodes)
        spool = open_spool(cfg, run_dir)
        recovered = Recovered()
        if journal is not None:  # episodes an earlier coordinator left unfinished: resumable, or ended now
            resume = cfg.coordinator.train and provider.survives_coordinator
            recovered = await recover(journal, spool, resume)
            if recovered.episodes:
                runlog.write("journal_recovered", **recovered.summary())
        store = JobStore(run_dir / "jobs.db")
        evals = EvalJobs(store, make_resolver(cfg.tasks), runner.as_attempt_runner(), cfg.coordinator.eval.concurrency,
                         limiter, cfg.limits, faults)
        scheduler = make_scheduler(cfg, limiter, spool)
        turn_rate = TurnRate(lambda: runner.stats.turns)
        status = RunStatusReader(cfg.name, state, runner.stats, spool, router.num_healthy_servers, turn_rate, faults)
        server = GrpcServer([CoordinatorServicer(evals, status).binding()], cfg.coordinator.server, cfg.auth)
        return cls(cfg, run_dir, state, runlog, metrics, provider, sandboxes, router, runner, limiter, spool, journal,
                   store, evals, scheduler, turn_rate, status, server, Background(on_failure), CrashWatch(run_dir),
                   recovered)

    async def start_services(self) -> str:
        """gRPC server up, unfinished eval jobs resumed, then the address written to
        <run_dir>/coordinator.json; returns the server's address. A local provider starts first, so
        what a dead run left is swept before this run serves anything. Jobs resume before the address
        is published: a client that found the address and watched a job before it was resumed saw its
        stream end while the job was still running."""
        if isinstance(self.provider, LocalProvider):
            await self.provider.start()
        if isinstance(self.provider, SweepsUnclaimed):  # what a dead coordinator left that no resumed episode takes
            swept = await self.provider.sweep_unclaimed({u.record.sandbox_id for u in self.recovered.unfinished})
            if swept:
                self.runlog.write("sandboxes_swept", count=swept)
        await self.server.start()
        address = self.server.address
        previous = self.crash_watch.previous()
        if previous.kind is ExitKind.CRASHED:
            log.error("the previous coordinator on %s crashed: %s", self.run_dir, previous.traceback.splitlines()[0])
        elif previous.kind is ExitKind.KILLED:
            log.warning("the previous coordinator on %s died without stopping (SIGKILL, the OOM killer?)", self.run_dir)
        self.crash_watch.arm()
        await self.evals.resume(previous, self.cfg.coordinator.eval.max_unclean_resumes)
        (self.run_dir / ADDRESS_FILE).write_text(json.dumps({"address": address, "pid": os.getpid()}) + "\n")
        self.runlog.write("start", address=address, name=self.cfg.name,
                          metrics_port=self.metrics.port if self.metrics else None)
        self.background.spawn(self._tick(), "status-ticker")
        return address

    def show_progress(self) -> asyncio.Task[None]:
        """The live display; cancel the task it returns to hide it (before the final report is printed)."""
        view = ProgressView(self.run_status, self.current_eval, self.planned_steps, self.runner.stats.training_tallies)
        return self.background.spawn(view.run(), "progress")

    def planned_steps(self) -> int:
        """The run's trainer steps: SFT (its cap until it has ended), critic warm-up, PPO; 0 without training."""
        if not self.cfg.coordinator.train:
            return 0
        ws = self.cfg.trainer.warm_start
        sft = ws.sft_steps if self.state.sft_steps_taken is None else self.state.sft_steps_taken
        return sft + ws.critic_warmup_steps + self.cfg.trainer.max_steps

    def current_eval(self) -> EvalProgress | None:
        job = self.state.eval_job
        if job is None:
            return None
        progress = self.evals.progress(job.job_id)
        return None if progress is None else EvalProgress(job.label, *progress, *self.evals.solved_so_far(job.job_id))

    def connect_trainer(self, target: str) -> TrainerSide:
        """Trainer link, weight sync and status poller against the trainer at `target`, running."""
        side = TrainerSide(TrainerLink(self.spool, target, self.cfg.auth),
                           WeightSync(target, self._load_weights, self.cfg.auth),
                           TrainerStatusPoller(target, self.runlog, self.cfg.auth,
                                               rollouts=self.runner.stats.training_tallies))
        self.background.spawn(side.link.run(), "trainer-link")
        self.background.spawn(side.weights.run(), "weight-sync")
        self.background.spawn(side.poller.run(), "trainer-status")
        return side

    async def _load_weights(self, path: str, version: int) -> None:
        pool = self.router.pool
        if pool is not None:
            await pool.update_weights(path, version)
        if self.router.scripted is not None:
            self.router.scripted.policy_version = version
        self.runlog.write("weights", version=version, path=path)

    async def _tick(self) -> None:
        """A status record every STATUS_EVERY_S, and at once when the stage changes (looked at every
        STAGE_CHECK_S), so the run page's stage timeline holds stages shorter than the period too."""
        last_t, last_stage = asyncio.get_running_loop().time(), ""
        while True:
            await asyncio.sleep(STAGE_CHECK_S)
            st, now = self.run_status(), asyncio.get_running_loop().time()
            if now - last_t < STATUS_EVERY_S and st.stage == last_stage:
                continue
            last_t, last_stage = now, st.stage
            self.runlog.write("status", stage=st.stage, active=st.active_episodes, finished=st.finished_episodes,
                              turns_per_s=round(st.turns_per_second, 3), spool_pending=st.spool_pending,
                              version=st.policy_version, trainer_step=st.trainer_step,
                              infra_failure_rate=st.infra_failure_rate)

    async def _cancel_episodes(self) -> None:
        """Training episodes still running (their stage was abandoned) are cancelled: nothing waits for them."""
        try:
            await self.scheduler.drain(0.0)
        except Exception as exc:  # reported by the stage that drained first; here it must not stop the teardown
            log.warning("shutdown: an episode task had failed: %r", exc)

    async def close(self, timeout_s: float) -> None:
        """Steps 3-7 of app.py's shutdown order (the caller has stopped and drained the scheduler), all of
        them within `timeout_s`: a step still running at the deadline is abandoned (and named in the log),
        and the files (spool, job store, run log) are closed whatever happened before."""
        self.scheduler.stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("episodes", self._cancel_episodes),
            ("the gRPC server", lambda: self.server.stop(self.cfg.coordinator.server.grace_s)),
            ("eval jobs", self.evals.close),
            ("background loops", self.background.stop),
            ("inference pools", self.router.close),
            # Half the time left destroys the sandboxes still out; the rest closes the provider.
            ("sandboxes", lambda: self.sandboxes.close(max(0.0, deadline - loop.time()) / 2)),
        ]
        step = steps[0][0]
        try:
            async with asyncio.timeout_at(deadline):
                for step, close in steps:
                    try:
                        await close()
                    except Exception:  # one part that fails to close must not leave the others open
                        log.exception("shutdown: closing %s failed; closing the rest", step)
        except TimeoutError:
            log.error("shutdown: %s did not stop within the %.0fs bound; abandoning the rest", step, timeout_s)
        finally:
            self._close_files()

    def _close_files(self) -> None:
        """The journal, the spool, the job store, the run log, metrics and the crash watch, each closed whatever
        the others did."""
        closes: list[tuple[str, Callable[[], object]]] = [
            ("the journal", self.journal.close if self.journal is not None else lambda: None),
            ("the spool", self.spool.close), ("the eval job database", self.store.close),
            ("the run log", lambda: self.runlog.write("stop", spool_pending=self.spool.pending_count)),
            ("the metrics server", self.metrics.stop if self.metrics is not None else lambda: None),
            ("the run log", self.runlog.close), ("the crash watch", self.crash_watch.disarm)]
        for what, close in closes:
            try:
                close()
            except Exception:
                log.exception("shutdown: closing %s failed; closing the rest", what)
