"""The t1-coordinator process: how its actors connect, in what order they start, and how they stop.

   t1 eval ... ──gRPC──► CoordinatorService ──► EvalJobs (SQLite: jobs + finished attempts)
                                                    │ attempts, job concurrency
   training_stream ► Scheduler ──[spool room? staleness bound?]──► RolloutRunner xN ◄─┘ (global limit)
                     ▲                                        │  Episode: SandboxPool ─SSH─► shells
                     │ version changed                        │           InferencePool ─► t1-inference xM
                     │                                        │  each turn ─► Journal (writer thread: a file
                     │                                        │               per live episode; back-pressure)
                 WeightSync ◄── WatchVersions ─┐              ▼
                     └── UpdateWeights ──► t1-inference   Spool (msgpack WAL, bounded)
                                               │              │ cursor, acks by id
                                          t1-trainer ◄── TrainerLink (PushTrajectories)
   TrainerStatusPoller (GetStatus ─► metrics, run log) · /metrics · run.jsonl · LagWatchdog

Start: run dir, metrics, run log, watchdog -> local stack (model, task sets, demos, children)
-> sandbox pool, generate router, journal -> spool (episodes the last coordinator left unfinished:
resumable ones wait for the training stage, which continues them in their reattached sandboxes
first; the others end as infra_error from their journals), job store -> gRPC server -> trainer link, weight sync,
status poller -> stages (eval base, SFT to its plateau, eval warm_start, critic warm-up and PPO,
eval rl, report) or serve eval jobs only.

Stop (end of run or SIGTERM/SIGINT): 1. the scheduler stops admitting; 2. in-flight episodes
get coordinator.shutdown_grace_s to finish, then are cancelled (eval attempts resume after a
restart; unfinished training episodes keep their journals for the next start, or lose them when
training is done); 3. the gRPC server stops with its grace;
4. eval jobs are closed (finished attempts are already in SQLite); 5. the trainer link and weight
sync stop, the journal writes what is queued, and the spool is closed (ack log flushed;
unacknowledged records stay for the next run); 6. pools, sandboxes and child services stop; 7. metrics and the run log
close.
Steps 3-7 of the coordinator's own parts run within coordinator.shutdown_timeout_s as a whole: a
step that hangs (a sandbox destroy that never returns) is abandoned, and the files still close.

Failure: a background loop that dies (parts.Background) or a child service that exits and cannot
be restarted (local.LocalStack.supervise) stops the run the same way, with that error.

Exit code: 0 for a training run that reached its end and for an eval-only coordinator stopped by a
signal (its normal end); EXIT_FAILED (1) after a failure, naming it; 128 + the signal for a
training run stopped before its end (its report says where it stopped, never "done").

The driver here is the only writer of the RunState (phase, eval job, trainer side); the stages
it calls take parts and return values.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Coroutine
from pathlib import Path
from typing import Any

from t1.config.schema import T1Config
from t1.coordinator.local.local_stack import LocalStack
from t1.coordinator.run import stages
from t1.coordinator.run.console_report import print_report
from t1.coordinator.run.gc_policy import GcSchedule
from t1.coordinator.run.parts import Parts
from t1.coordinator.run.run_report import EvalsByLabel, RunReport
from t1.coordinator.run.run_state import EvalJobRef, RunPhase, RunState, TrainerSide
from t1.coordinator.run.sft_steer import SftOutcome, SftSteer, steered_sft
from t1.evals.stats import EvalSummary
from t1.metrics.watchdog import LagWatchdog
from t1.rpc.loop import cancel_and_wait, freeze_long_lived, wait_or_stop
from t1.sandbox.factory import start_ahead, stop_ahead
from t1.tasks.spec import TaskSpec
from t1.workdir import DirLock

log = logging.getLogger(__name__)
EXIT_FAILED = 1
# The three policies of a run, evaluated on the same held-out sets: before SFT, after SFT, after PPO.
EVAL_PHASES = {"base": RunPhase.EVAL_BEFORE, "warm_start": RunPhase.EVAL_WARM_START, "rl": RunPhase.EVAL_AFTER}


class Coordinator:
    """`await Coordinator(cfg, config_file, overrides).run()` -> exit code."""

    def __init__(self, cfg: T1Config, config_file: str | None = None, overrides: list[str] | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.coordinator.run_dir)
        self.local = LocalStack(cfg, config_file, list(overrides or []), self.run_dir)
        self.state = RunState()
        self.parts: Parts | None = None
        self.stop_requested = asyncio.Event()
        self.stop_signal: signal.Signals | None = None
        self.failure: BaseException | None = None
        self.report: RunReport | None = None
        self._gc = GcSchedule(cfg.coordinator.gc_full_interval_s)

    def request_stop(self) -> None:
        if not self.stop_requested.is_set():
            log.info("stop requested: no new episodes; in-flight ones get %.0fs", self.cfg.coordinator.shutdown_grace_s)
        self.stop_requested.set()
        if self.parts is not None:
            self.parts.scheduler.stop()

    def fail(self, error: BaseException) -> None:
        """A part the run needs has failed: the run stops, and ends with this error (the first one)."""
        if self.failure is None:
            self.failure = error
            log.error("the run fails: %s", error)
        self.request_stop()

    def _on_signal(self, sig: signal.Signals) -> None:
        self.stop_signal = self.stop_signal or sig
        self.request_stop()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        supervisor: asyncio.Task[None] | None = None
        run_dir_lock = DirLock(self.run_dir, "t1-coordinator").acquire()  # before any child or file is touched
        await asyncio.to_thread(start_ahead, self.cfg.sandbox, self.run_dir)  # the sandbox service starts meanwhile
        watchdog = LagWatchdog(warn_s=self.cfg.coordinator.loop_lag_warn_ms / 1000)
        watchdog.start()
        try:
            sets = await self.local.prepare()
            supervisor = asyncio.create_task(self.local.supervise(), name="child-supervisor")
            supervisor.add_done_callback(self._supervisor_ended)
            # Inference servers start while the parts are built (and, when training, while the oracle
            # demonstrations run, which need no model); eval-only serving waits for them first.
            endpoints = asyncio.ensure_future(self.local.inference_endpoints())
            early = await endpoints if not self.cfg.coordinator.train else []
            self.parts = parts = await Parts.build(self.cfg, self.run_dir, early, self.state, self.fail)
            if self.stop_requested.is_set():
                parts.scheduler.stop()
            try:
                address = await parts.start_services()
                freeze_long_lived()  # task sets, tokenizers, clients: full collections skip them from now on
                self._gc.start()
                progress = parts.show_progress()
                log.info("coordinator serving on %s (run dir %s)", address, self.run_dir)
                await self._until_stopped(self._work(parts, sets, endpoints, progress))
            finally:
                self._gc.stop()
                await _discard(endpoints)
                await parts.close(self.cfg.coordinator.shutdown_timeout_s)
        finally:
            await _discard(supervisor)  # its failure, if any, was reported by _supervisor_ended
            try:
                await stop_ahead(self.cfg.sandbox, self.run_dir)
            except Exception as exc:  # shutting down: the service's own grace period ends it anyway
                log.warning("could not stop the sandbox service started ahead: %s", exc)
            await self.local.stop()
            await watchdog.stop()
            run_dir_lock.release()
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(ValueError, RuntimeError):
                    loop.remove_signal_handler(sig)
        return self._exit_code()

    def _supervisor_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (err := task.exception()) is not None:
            self.fail(err)

    def _exit_code(self) -> int:
        if self.failure is not None:
            print(f"error: the run failed: {self.failure}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        if self.cfg.coordinator.train and self.state.phase is not RunPhase.DONE:
            sig = self.stop_signal or signal.SIGTERM
            trainer = self.state.trainer
            step = trainer.poller.last.step if trainer is not None and trainer.poller.last is not None else 0
            planned = self.parts.planned_steps() if self.parts is not None else 0
            print(f"t1: run {self.cfg.name} stopped by {sig.name} before its end (phase {self.state.phase}, trainer "
                  f"step {step} of {planned}); t1-coordinator --resume goes on from its last checkpoint",
                  file=sys.stderr, flush=True)
            return 128 + int(sig)
        return 0

    async def _work(self, parts: Parts, sets: dict[str, list[TaskSpec]], endpoints: asyncio.Future[list[str]],
                    progress: asyncio.Task[None]) -> None:
        cfg = self.cfg
        if not cfg.coordinator.train:
            self.state.phase = RunPhase.SERVING
            await self.stop_requested.wait()
            return
        ws = cfg.trainer.warm_start
        if cfg.trainer.trains_on_demos and ws.demos_path is not None and not ws.demos_path.exists():
            self.state.phase = RunPhase.WARM_START_DEMOS
            await stages.write_demos(
                parts, [t for n in ws.demo_sets or cfg.tasks.train for t in sets[n]], ws.demos_path
            )
        # The trainer starts (and warm-starts) while the inference servers come up and the first eval runs.
        trainer = asyncio.ensure_future(self.local.trainer_endpoint())
        try:
            self.state.phase = RunPhase.STARTING_SERVICES
            if eps := await endpoints:
                parts.router.connect(eps)
            self.report = await self._train_run(parts, sets, trainer)
        finally:
            await _discard(trainer)
        await cancel_and_wait(progress)  # the live display ends before the report is printed
        print_report(self.report)

    async def _train_run(self, parts: Parts, sets: dict[str, list[TaskSpec]], trainer_target: Awaitable[str]
                         ) -> RunReport:
        """The whole training run in its phases; returns the report (also written to <run_dir>/report.json).

        Evals: `base` before SFT, `warm_start` after SFT (steered to its plateau when
        warm_start.sft_eval_every is set), `rl` after PPO; each {set name: summary}."""
        cfg, stop = self.cfg, self.stop_requested
        ws = cfg.trainer.warm_start
        evals: EvalsByLabel = {}
        if cfg.coordinator.eval.before_training and cfg.tasks.eval and not stop.is_set():
            evals["base"] = await self._eval("base", cfg.tasks.eval, cfg.coordinator.eval.base_attempts)
        self.state.phase = RunPhase.STARTING_TRAINER
        self.state.trainer = trainer = parts.connect_trainer(await trainer_target)
        sft: SftOutcome | None = None
        if ws.sft_steps > 0 and not stop.is_set():
            self.state.phase = RunPhase.SFT
            sft = await self._sft(trainer)
            # the plan's SFT part: the steps SFT took (a fresh run has no PPO version yet; a resumed one is capped)
            self.state.sft_steps_taken = sft.steps if sft else min(trainer.weights.version, ws.sft_steps)
            if cfg.tasks.eval and not stop.is_set():
                evals["warm_start"] = await self._eval("warm_start", cfg.tasks.eval)
        trained = False
        if not stop.is_set():
            self.state.phase = RunPhase.TRAINING
            end = await stages.training_stage(parts, trainer, [t for name in cfg.tasks.train for t in sets[name]])
            trained = end.trainer_done
            if trained:
                self.state.phase = RunPhase.TRAINED
        if cfg.tasks.eval and not stop.is_set():
            evals["rl"] = await self._eval("rl", cfg.tasks.eval)
        finished = trained and not stop.is_set()  # a stop during the last eval leaves it unfinished too
        report = stages.write_report(parts, trainer, evals, sft_curve=sft.curve if sft else (),
                                     sft_kept_step=sft.kept_step if sft else None, finished=finished,
                                     planned_steps=parts.planned_steps())
        if finished:
            self.state.phase = RunPhase.DONE
        return report

    async def _sft(self, trainer: TrainerSide) -> SftOutcome | None:
        """SFT to its end: steered rounds with validation evals, or the trainer's sft_steps on its own (None)."""
        ws = self.cfg.trainer.warm_start
        if ws.sft_eval_every is None or ws.sft_validation_set is None:
            await wait_or_stop(trainer.weights.wait_for_version(lambda v: v >= ws.sft_steps), self.stop_requested)
            return None
        val = ws.sft_validation_set
        steer = SftSteer(trainer.poller.target, self.cfg.auth)

        async def evaluate(label: str) -> EvalSummary:
            return (await self._eval(label, [val], ws.sft_eval_attempts, RunPhase.SFT))[val]

        try:
            return await steered_sft(trainer, steer, ws, evaluate)
        finally:
            await steer.close()

    async def _eval(self, label: str, set_names: list[str], attempts: int | None = None,
                    phase: RunPhase | None = None) -> dict[str, EvalSummary]:
        """One eval job per set, run to the end; per-set summaries."""
        assert self.parts is not None
        out: dict[str, EvalSummary] = {}
        for name in set_names:
            self.state.phase = phase or EVAL_PHASES[label]
            record = await stages.submit_eval(self.parts, label, name, attempts or self.cfg.coordinator.eval.attempts)
            self.state.eval_job = EvalJobRef(f"eval {label}", record.job_id)
            try:
                out[name] = await stages.eval_result(self.parts, label, name, record.job_id)
            finally:
                self.state.eval_job = None
        return out

    async def _until_stopped(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work`; on a stop request give it the grace period (training drains itself), then cancel it."""
        task = asyncio.ensure_future(work)
        if not await wait_or_stop(task, self.stop_requested):
            grace = self.cfg.coordinator.shutdown_grace_s + 5.0
            done, _ = await asyncio.wait({task}, timeout=grace)
            if not done:
                log.warning("stage %s did not end within %.0fs: abandoning it", self.state.phase, grace)
                await cancel_and_wait(task)
                return
            task.result()


async def _discard(fut: asyncio.Future[Any] | None) -> None:
    """Cancel a start-up future that is no longer wanted; its failure has been or will be reported elsewhere."""
    if fut is None:
        return
    if not fut.done():
        fut.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await fut
