"""Rollout workers: build an Episode from config and a task, run it, and hand on the result.

`RolloutRunner.run_episode` is shared by training (the trajectory goes to the spool) and eval
jobs (`as_attempt_runner` turns the result into an AttemptOutcome; nothing is spooled).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from t1.agent.baseline import SharedBaselines
from t1.agent.episode import Episode, EpisodeLimits, EpisodeResult, EpisodeSpec, SandboxAcquire
from t1.agent.formats import AgentFormat, FormatName, get_format
from t1.agent.harness import HarnessEpisode
from t1.agent.resume_point import NotResumable, ResumePoint, resume_point
from t1.agent.transcript import Transcript
from t1.config.coordinator import ShardConfig
from t1.config.schema import T1Config
from t1.coordinator.evals.eval_jobs import EvalAttempt
from t1.coordinator.spool.journal import EpisodeJournal, Journal, cut, read_frames
from t1.coordinator.spool.journal_recovery import Unfinished, end_unfinished
from t1.coordinator.spool.trajectory_spool import Spool
from t1.evals.results import AttemptOutcome
from t1.gateway.renderers import ToolRenderers
from t1.inference.types import GenerateFn, SamplingParams
from t1.metrics import registry as m
from t1.metrics.write_faults import WriteFaults
from t1.sandbox.loopback_port import SandboxPorts
from t1.sandbox.types import LOCAL_TRAITS, Sandbox, SandboxGone, SandboxRecord, SandboxTraits
from t1.tasks.spec import TaskSpec
from t1.tasks.verify.rewards import RewardMode
from t1.tito import ChatRenderer
from t1.trajectory.offload import offload
from t1.trajectory.serialization import encode_trajectory
from t1.trajectory.types import EpisodeStatus, Trajectory

log = logging.getLogger(__name__)
# Picks an episode's generate function: (its eval job or None for training, its task, its format).
GenerateFor = Callable[[EvalAttempt | None, TaskSpec, AgentFormat], GenerateFn]
# Reattaches a dead coordinator's sandbox for the block (SandboxPool.reattach; SandboxGone when it cannot).
Reattach = Callable[[SandboxRecord], AbstractAsyncContextManager[Sandbox]]
ENDING_SLOTS = 4  # episodes between their export and the end of persisting, at once


def sampling_from_config(cfg: T1Config) -> SamplingParams:
    s = cfg.rollout.sampling
    return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_tokens)


@dataclass(frozen=True, slots=True)
class EpisodeOptions:
    """How one episode is played. The defaults are a demonstration's: the run's format and timeouts, no job, the
    run's reward mode, transcripts under train/ unless `subdir` says otherwise, nothing persisted.

    The verifiers run after every K-th turn (reward.process_every_k_turns) only when `process_rewards`: the
    per-turn rewards are a training signal, so evals and demonstrations run only the final verification (a
    verifier run per turn was most of their wall time)."""

    fmt_name: str = ""                            # the agent format; "" is rollout.agent_format
    timeout_multiplier: float | None = None       # scales the episode's time limits (an eval job's)
    job: EvalAttempt | None = None                # the eval attempt this episode plays; None for training
    reward_mode: RewardMode | None = None         # None is the runner's
    subdir: str = "train"                         # the transcripts' folder under the run's transcripts dir
    generate: GenerateFn | None = None            # None: generate_for picks one
    persist: Callable[[Trajectory], Awaitable[None]] | None = None  # where the finished trajectory goes
    process_rewards: bool = False


@dataclass(slots=True)
class RolloutStats:
    active: int = 0      # episodes playing now (exports and spooling not included)
    finished: int = 0
    infra_errors: int = 0
    turns: int = 0
    drift_tokens: int = 0
    segments: int = 0            # of every finished episode's trajectory
    drift_segments: int = 0      # of those, segments with TITO drift (must be 0)
    retokenize_changed: int = 0
    retokenize_total: int = 0
    template_mismatches: int = 0  # TITO: turns whose template rendering differed from the buffer (tito counters)
    versions: set[int] = field(default_factory=set)  # policy versions that sampled tokens of training episodes
    train_scored: int = 0        # training episodes that were not infra errors
    train_resolved: int = 0
    train_reward_sum: float = 0.0
    gateway_segments: Counter[str] = field(default_factory=Counter)  # harness episodes' segment starts by cause
    resumed: int = 0             # episodes a dead coordinator left that continued from their last turn
    resume_turns_lost: int = 0   # turns in flight when it died (at most one per resumed episode)
    resume_failed: int = 0       # episodes it left that could not continue (sandbox gone): infra_error

    def training_tallies(self) -> dict[str, float]:
        """Cumulative counts of scored training episodes (the run log's trainer records carry them: curves)."""
        return {"episodes": self.train_scored, "resolved": self.train_resolved,
                "reward_sum": round(self.train_reward_sum, 6)}

    @property
    def retokenize_mismatch_rate(self) -> float:
        return self.retokenize_changed / self.retokenize_total if self.retokenize_total else 0.0


class RolloutRunner:
    """Runs episodes; `generate_for` picks the generate function (the pool, a job's pool, a script)."""

    def __init__(self, cfg: T1Config, renderers: Mapping[FormatName, ChatRenderer], acquire: SandboxAcquire,
                 generate_for: GenerateFor, transcripts_dir: Path | None,
                 sandboxes: SandboxTraits = LOCAL_TRAITS, reward_mode: RewardMode | None = None,
                 journal: Journal | None = None, ports: SandboxPorts | None = None,
                 faults: WriteFaults | None = None) -> None:
        if cfg.rollout.harness.command and ports is None:
            raise ValueError("rollout.harness.command: a harness needs a sandbox provider that opens its gateway "
                             "inside the sandbox (sandbox.provider: local)")
        self.cfg = cfg
        self.journal = journal
        self.faults = faults
        self._ports = ports
        self._tool_renderers: dict[FormatName, ToolRenderers] = {}  # harness episodes': shared by the run
        self.renderers = renderers
        self._acquire = acquire
        self._generate_for = generate_for
        self._transcripts = transcripts_dir if cfg.rollout.transcripts else None
        self._sandboxes = sandboxes
        self._reward_mode = RewardMode(reward_mode or cfg.reward.mode)
        self.stats = RolloutStats()
        self._ending = asyncio.Semaphore(ENDING_SLOTS)
        self._baselines = SharedBaselines() if cfg.reward.shared_baseline else None

    async def run_episode(self, task: TaskSpec, group_id: str, attempt: int,
                          options: EpisodeOptions = EpisodeOptions()) -> EpisodeResult:
        """One episode, played as `options` say (a training attempt, an eval attempt, a demonstration)."""
        fmt = get_format(options.fmt_name or self.cfg.rollout.agent_format)
        # Eval attempts may run again after a restart: each run gets its own id (and transcript).
        episode_id = f"{group_id}-a{attempt}" + ("" if options.job is None else f"-{uuid.uuid4().hex[:6]}")
        limits = EpisodeLimits.from_config(self.cfg.rollout, self.cfg.reward, options.timeout_multiplier)
        harness = self.cfg.rollout.harness
        if not options.process_rewards or harness.command:  # a harness's calls are not turns the verifier can follow
            limits = replace(limits, process_every_k=None)
        spec = EpisodeSpec(episode_id, task, group_id, attempt, fmt, sampling_from_config(self.cfg), limits,
                           options.reward_mode or self._reward_mode)
        tx_dir = self._transcripts / options.subdir if self._transcripts is not None else None
        generate = options.generate or self._generate_for(options.job, task, fmt)
        transcript = Transcript(tx_dir, task.id, episode_id, self.faults)
        journal = None
        if harness.command:  # no per-turn journal: a harness process does not outlive its coordinator
            assert self._ports is not None
            tools = self._tool_renderers.setdefault(fmt.name, ToolRenderers(self.renderers[fmt.name]))
            episode: Episode = HarnessEpisode(spec, generate, self._acquire, self.renderers[fmt.name], transcript,
                                              ports=self._ports, harness=harness, sandboxes=self._sandboxes,
                                              tool_renderers=tools)
        else:
            journal = None if self.journal is None else self.journal.episode(episode_id, training=options.job is None)
            episode = Episode(spec, generate, self._acquire, self.renderers[fmt.name], transcript,
                              sandboxes=self._sandboxes, baselines=self._baselines, journal=journal)
        return await self._played(episode, journal, options.persist)

    async def _played(self, episode: Episode, journal: EpisodeJournal | None,
                      persist: Callable[[Trajectory], Awaitable[None]] | None) -> EpisodeResult:
        """Play the episode, export it, persist its trajectory, count it."""
        episode_id, task = episode.spec.episode_id, episode.spec.task
        self.stats.active += 1
        try:
            end = await episode.play()
        finally:
            self.stats.active -= 1
        try:
            # From the export on, the episode holds one of the ending slots: they bound how many exported
            # trajectories (copies of tens of MB each) exist at once when many episodes end together
            # (a SIGTERM drain, a failure storm, the load bench's stop), and the spool's disk sets the pace.
            async with self._ending:
                result = await episode.export(end)
                if persist is not None:
                    await persist(result.trajectory)
            if journal is not None:  # spooled (or not for the spool): the journal has done its job
                journal.release()
        finally:
            episode.close()
        self.stats.finished += 1
        if isinstance(episode, HarnessEpisode):
            self.stats.gateway_segments.update(episode.segment_causes)
        self.stats.turns += result.turns
        self.stats.infra_errors += result.status is EpisodeStatus.INFRA_ERROR
        m.INFRA_FAILURE_RATE.set(self.stats.infra_errors / self.stats.finished)
        self.stats.drift_tokens += result.drift_tokens
        self.stats.segments += result.num_segments
        self.stats.drift_segments += result.drift_segments
        self.stats.retokenize_changed += result.retokenize_changed
        self.stats.retokenize_total += result.retokenize_total
        self.stats.template_mismatches += result.trajectory.tito.template_mismatches
        m.TITO_DRIFT_TOKENS.set(self.stats.drift_tokens)
        m.RETOKENIZE_MISMATCH_RATE.set(self.stats.retokenize_mismatch_rate)
        if result.drift_tokens:
            log.error("episode %s: %d tokens of TITO drift in the loss region", episode_id, result.drift_tokens)
        log.info("episode %s (%s): %s, reward %g, %d turns, %.1fs", episode_id, task.id, result.status.value,
                 result.trajectory.reward, result.turns, result.duration_s)
        return result

    def _spooler(self, spool: Spool) -> Callable[[Trajectory], Awaitable[None]]:
        async def persist(traj: Trajectory) -> None:
            # Encoding tens of MB of routing is pure work: off the event loop, like the export before it.
            payload, versions = await offload(_encode, traj)
            self.stats.versions.update(versions)
            await spool.append(traj.id, payload)

        return persist

    async def train_episode(self, task: TaskSpec, group_id: str, attempt: int, spool: Spool) -> EpisodeResult:
        """One training attempt; its trajectory (infra errors too, so the group completes) is spooled."""
        options = EpisodeOptions(persist=self._spooler(spool), process_rewards=True)
        result = await self.run_episode(task, group_id, attempt, options)
        self._tally_training(result)
        return result

    async def resume_episode(self, unfinished: Unfinished, task: TaskSpec | None, spool: Spool,
                             reattach: Reattach) -> EpisodeResult | None:
        """Continue a training episode a dead coordinator left (its journal, its sandbox) from its last turn; its
        trajectory is spooled like any training episode's. When it cannot continue (its sandbox is gone, its task
        is no longer in the task sets) it ends as infra_error from its journal (spooled, counted) and None is
        returned."""
        assert self.journal is not None
        path, episode_id = unfinished.path, unfinished.episode_id
        why = "its task is not in this run's task sets" if task is None else ""
        point = None if task is None else await offload(_resume_point, path)
        if point is None and task is not None:
            why = "its journal has no resume point any more"
        if task is not None and point is not None:
            try:
                async with reattach(unfinished.record) as sandbox:
                    result = await self._resumed(task, point, sandbox, spool)
                self._tally_training(result)
                return result
            except SandboxGone as exc:  # at the reattach: the episode never started here
                why = f"its sandbox is gone: {exc}"
        log.warning("episode %s cannot resume (%s): it ends as infra_error", episode_id, why)
        self.stats.resume_failed += 1
        await end_unfinished(self.journal, spool, path, kind="resume_failed")
        self.stats.finished += 1
        self.stats.infra_errors += 1
        m.INFRA_FAILURE_RATE.set(self.stats.infra_errors / self.stats.finished)
        return None

    async def _resumed(self, task: TaskSpec, point: ResumePoint, sandbox: Sandbox, spool: Spool) -> EpisodeResult:
        assert self.journal is not None
        fmt = get_format(point.agent_format)
        limits = EpisodeLimits.from_config(self.cfg.rollout, self.cfg.reward)
        spec = EpisodeSpec(point.episode_id, task, point.group_id, point.attempt, fmt, sampling_from_config(self.cfg),
                           limits, self._reward_mode)
        journal = self.journal.episode(point.episode_id)
        tx_dir = self._transcripts / "train" if self._transcripts is not None else None
        episode = Episode(spec, self._generate_for(None, task, fmt), self._acquire, self.renderers[fmt.name],
                          Transcript(tx_dir, task.id, point.episode_id, self.faults, append=True),
                          sandboxes=self._sandboxes, baselines=self._baselines, journal=journal,
                          resume=(point, sandbox))
        self.stats.resumed += 1
        self.stats.resume_turns_lost += point.turn_lost
        m.EPISODES_RESUMED.inc()
        log.info("episode %s resumes after turn %d in sandbox %s%s", point.episode_id, point.turns, sandbox.id,
                 " (the turn in flight is lost)" if point.turn_lost else "")
        return await self._played(episode, journal, self._spooler(spool))

    def _tally_training(self, result: EpisodeResult) -> None:
        if result.status is not EpisodeStatus.INFRA_ERROR:
            self.stats.train_scored += 1
            self.stats.train_resolved += result.report.resolved
            self.stats.train_reward_sum += result.trajectory.reward

    def as_attempt_runner(self):  # -> AttemptRunner
        async def run(a: EvalAttempt) -> AttemptOutcome:
            group = f"eval-{a.job_id}-{a.task.id}"
            # Binary reward for evals: the benchmark's metric; counts stay in passed/total.
            options = EpisodeOptions(fmt_name=a.agent_format,
                                     timeout_multiplier=a.timeout_multiplier * self.cfg.rollout.timeout_multiplier,
                                     job=a, reward_mode=RewardMode.BINARY, subdir=f"eval/{a.job_id}")
            r = await self.run_episode(a.task, group, a.attempt, options)
            return outcome_of(a.task.id, a.attempt, r)

        return run


def _resume_point(path: Path) -> ResumePoint | None:
    """The journal's resume point, the journal cut there (blocking file I/O: off the loop); None if it has none."""
    try:
        point = resume_point(read_frames(path))
    except NotResumable:
        return None
    cut(path, point.keep_bytes)
    return point


def _encode(traj: Trajectory) -> tuple[bytes, set[int]]:
    """The spool payload, and the policy versions that sampled the trajectory's tokens."""
    versions: set[int] = set()
    for seg in traj.segments:
        versions.update(int(v) for v in np.unique(seg.policy_versions[seg.loss_mask]))
    return encode_trajectory(traj), versions


def outcome_of(task_id: str, attempt: int, r: EpisodeResult) -> AttemptOutcome:
    infra = r.status is EpisodeStatus.INFRA_ERROR
    return AttemptOutcome(task_id=task_id, attempt=attempt, reward=r.trajectory.reward, passed=r.report.passed,
                          total=r.report.total, status=r.status, turns=r.turns, tokens=r.trajectory.num_tokens,
                          segments=r.num_segments,
                          duration_s=r.duration_s, failure_mode=r.failure_mode,
                          resolved=(not infra) and r.report.resolved,
                          why="" if r.report.resolved and not infra else (r.failure_mode or r.report.why),
                          failed_tests=tuple((t.name, t.message) for t in r.report.failed_tests),
                          verifier_output_tail=r.report.output_tail[-2000:])


def new_group_id(task: TaskSpec, shard: ShardConfig | None = None) -> str:
    """Unique across coordinator restarts (the trainer deduplicates by trajectory id) and, with several
    coordinators, across shards: the shard index is part of the id (`TASK-s1-...`)."""
    where = "" if shard is None or shard.count == 1 else f"s{shard.index}-"
    return f"{task.id}-{where}{uuid.uuid4().hex[:10]}"
