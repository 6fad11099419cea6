"""The episode: one task attempt from sandbox to trajectory.

    sandbox + shell -> provision -> TokenBuffer(opening)
    loop: limits? -> generate (session affinity; retried) -> parse -> run commands -> observation
          (every K turns: verifiers -> process reward; context full: compact -> new segment)
    end:  verifiers -> reward -> Trajectory (+ transcript)

`run()` is `play()` then `export()`: a caller that bounds how many exported trajectories exist
at once (the RolloutRunner) calls the two itself and exports under its own slot.

With a journal (t1/coordinator/spool/journal.py) every turn goes to disk as it completes and the
episode keeps only what its next turn needs: the buffer's ids and messages, counters, the last
commands for a compaction note. The export replays the journal into the trajectory.

Statuses: ok (done or turn limit), timeout (task wall clock), context_limit, infra_error
(sandbox lost or setup failing before the agent acted, inference failing past retries). Infra
errors never get a reward: their trajectory carries reward 0 and status infra_error, and the
trainer drops it. Once the agent has acted, a sandbox fault is the attempt's own failure
(`t1.tasks.verify.outcome`): reward 0, counted, with its failure mode. Verifiers run in verifier shells.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from contextlib import AbstractAsyncContextManager

import numpy as np

from t1.agent.baseline import SharedBaselines
from t1.agent.compaction import SUMMARY_REQUEST, Message, RecentCommands, summary_of
from t1.agent.context_fit import ContextFit
from t1.agent.episode_limits import EpisodeLimits
from t1.agent.episode_types import (
    INFRA_ERRORS,
    EpisodeEnd,
    EpisodeResult,
    EpisodeSpec,
    InferenceFailed,
    SandboxAcquire,
    _End,
    acquire_from,
)
from t1.agent.episode_verifier import EpisodeVerifier
from t1.agent.formats import format_output
from t1.agent.pacing import pace
from t1.agent.policy_call import call_policy, is_text_level
from t1.agent.resume_point import ResumePoint, provisioned_record
from t1.agent.shell_state import ShellState, StateWatch, probe, restore
from t1.agent.transcript import Transcript
from t1.agent.turn_journal import TurnJournal
from t1.inference.types import (
    FinishReason,
    GenerateFn,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    SessionGenerateFn,
)
from t1.metrics import registry as m
from t1.sandbox.ssh.ssh_sandbox import lost_cause
from t1.sandbox.types import LOCAL_TRAITS, Sandbox, SandboxLost, SandboxTraits, Shell
from t1.tasks.provision import Provisioned, enter_step, provision, sandbox_request
from t1.tasks.spec import StepSpec
from t1.tasks.verify.outcome import attempt_failure
from t1.tasks.verify.report import FailureMode, VerifierReport
from t1.tasks.verify.rewards import (
    checkpoint_turns,
    combine_steps,
    episode_reward,
    passes_gate,
    process_rewards,
)
from t1.tito import ChatRenderer, TokenBuffer
from t1.tito.diagnostics import trajectory_checks
from t1.tito.replay import replay
from t1.trajectory.offload import offload
from t1.trajectory.types import EpisodeStatus, Trajectory, VerifierSummary

__all__ = ["Episode", "EpisodeEnd", "EpisodeLimits", "EpisodeResult", "EpisodeSpec", "InferenceFailed",
           "SandboxAcquire", "acquire_from"]

log = logging.getLogger(__name__)
_SUMMARY_ASK: Message = {"role": "user", "content": SUMMARY_REQUEST}


class Episode:
    """Runs one EpisodeSpec with the given generate function, sandbox source and renderer."""

    def __init__(self, spec: EpisodeSpec, generate: GenerateFn, acquire: SandboxAcquire, renderer: ChatRenderer,
                 transcript: Transcript, *, sandboxes: SandboxTraits = LOCAL_TRAITS,
                 baselines: SharedBaselines | None = None, journal: TurnJournal | None = None,
                 resume: tuple[ResumePoint, Sandbox] | None = None) -> None:
        """`resume`: continue a journaled episode a dead coordinator left at this point, in this (reattached)
        sandbox; `journal` is its journal, already cut at the point (t1/coordinator/spool/journal_recovery.py)."""
        self.spec = spec
        self._journal = journal
        self._generate = generate
        self._acquire = acquire
        self._renderer = renderer
        self._sandboxes = sandboxes
        self.tx = transcript
        self._verifier = EpisodeVerifier(spec, acquire, sandboxes, baselines, transcript)
        opening = spec.fmt.first_messages(spec.task.phases()[0].instruction)
        self.turns = 0
        self._checkpoints: dict[int, int] = {}  # turn -> passing verifiers after it (process rewards)
        self._bad_turns: list[int] = []  # turns whose reply had no valid action (reward.bad_reply_penalty)
        self._commands = RecentCommands()
        self._fit = ContextFit(spec.limits, spec.sampling.max_tokens, renderer, len(opening), self._commands,
                               transcript, self._end_session)
        self._baseline = 0  # passing verifiers before the agent's first turn (process rewards)
        self._pending_obs: list[dict] = []
        self._shell_state: ShellState | None = None  # the last one journaled
        self._state_watch = StateWatch()  # which turns may have changed the shell's state: those are probed
        self._resume = resume
        self._phase = 0  # the task step being played
        self._t0 = 0.0
        if resume is None:
            if journal is not None:
                journal.begin(task_id=spec.task.id, group_id=spec.group_id, attempt=spec.attempt,
                              agent_format=spec.fmt.name.value)
            self.buf = TokenBuffer(renderer, opening, sink=journal)
        else:
            self._restore(resume[0])
            # The records it was rebuilt from (every turn's arrays) are not kept: memory stays bounded.
            self._resume = (dataclasses.replace(resume[0], buffer_events=(), commands=()), resume[1])
        # The sampler's record, kept apart from the buffer: (segment, start position, sampled ids); a
        # journaled episode's is its journal's generations.
        self._sampled: list[tuple[int, int, np.ndarray]] = []
        # Labelled children looked up once, not per turn.
        self._generate_latency = m.TURN_LATENCY.labels(part="generate")
        self._commands_latency = m.TURN_LATENCY.labels(part="commands")

    def _restore(self, point: ResumePoint) -> None:
        if self._journal is None:
            raise ValueError("only a journaled episode resumes")
        self.buf = TokenBuffer.restore(self._renderer, point.buffer_events, point.tito, sink=self._journal)
        self.turns, self._fit.segments, self._baseline = point.turns, point.segments, point.baseline
        self._checkpoints, self._bad_turns = dict(point.checkpoints), list(point.bad_turns)
        for command, exit_code in point.commands:
            self._commands.append(command, exit_code)
        self._pending_obs, self._shell_state = [dict(o) for o in point.pending_obs], point.shell
        self._journal.resumed(turns=point.turns, turn_lost=point.turn_lost)

    async def run(self) -> EpisodeResult:
        """The whole episode: play, then export."""
        return await self.export(await self.play())

    async def play(self) -> EpisodeEnd:
        """Sandbox, turns, verifiers: how the episode ended. Nothing is exported yet."""
        try:
            return await self._play()
        except BaseException:
            self.close()  # flushes the buffered transcript however the episode ends, cancelled included
            raise
        finally:
            self._end_session()

    @property
    def session_id(self) -> str:
        """The generate session of the current segment (one per segment: compaction starts a new one)."""
        resumes = "" if self._resume is None else f"/r{self._resume[0].resumes + 1}"  # a session no server has
        return f"{self.spec.episode_id}/s{self._fit.segments}{resumes}"

    def _end_session(self) -> None:
        if isinstance(self._generate, SessionGenerateFn):
            self._generate.end_session(self.session_id)

    def close(self) -> None:
        """Flush and close the transcript (safe more than once)."""
        self.tx.close()

    async def _play(self) -> EpisodeEnd:
        t0 = self._t0 = time.monotonic() - (0.0 if self._resume is None else self._resume[0].elapsed_s)
        spec, task = self.spec, self.spec.task
        deadline = t0 + task.agent_timeout_sec * spec.limits.timeout_multiplier
        if self._resume is None:
            self.tx.header(task.id, spec.episode_id, spec.fmt.name.value, task.phases()[0].instruction,
                           len(self.buf.prompt_ids()))
        else:
            self.tx.note(f"the coordinator restarted: the episode resumes after turn {self.turns} in the same "
                         f"sandbox, in a new shell" + (" (the turn in flight was lost)" if self._resume[0].turn_lost
                                                       else ""))
        if self.text_level:
            self.tx.note("text-level: the endpoint answers with text; the ids here are T1's tokenization of it")
        status, why, report = EpisodeStatus.OK, "", VerifierReport()
        m.ACTIVE_EPISODES.inc()
        try:
            for setup_try in range(spec.limits.setup_retries + 1):
                try:
                    status, why, report = await self._in_sandbox(deadline)
                    break
                except SandboxLost as exc:
                    # Lost before the agent acted: a fresh sandbox changes nothing the policy saw.
                    if self.turns > 0 or setup_try == spec.limits.setup_retries or self._resume is not None:
                        raise
                    m.INFRA_FAILURES.labels(kind="sandbox_setup_retried").inc()
                    log.warning("episode %s: sandbox lost during setup (%s); retrying on a fresh one",
                                spec.episode_id, exc)
        except Exception as exc:  # the fault-tolerance point: the episode fails, the run goes on
            failure = attempt_failure(exc, agent_acted=bool(self._commands))
            if failure is not None:  # the policy's own doing: scored 0, counted
                log.info("episode %s (%s): the attempt broke its sandbox: %s", spec.episode_id, task.id, exc)
                why, report = f"{failure.value}: {exc}", VerifierReport(failure_mode=failure, detail=str(exc))
            else:
                status, why, report = self._infra_error(exc)
        finally:
            m.ACTIVE_EPISODES.dec()
        return EpisodeEnd(status, why, report, time.monotonic() - t0)

    def _infra_error(self, exc: Exception) -> tuple[EpisodeStatus, str, VerifierReport]:
        spec, task = self.spec, self.spec.task
        kind = type(exc).__name__
        if not isinstance(exc, INFRA_ERRORS):  # a bug, not the policy's doing: logged loudly, never scored
            log.exception("episode %s (%s) crashed", spec.episode_id, task.id)
            kind = f"crash:{kind}"
        m.INFRA_FAILURES.labels(kind=kind).inc()
        log.warning("episode %s (%s): infra error: %s: %s", spec.episode_id, task.id, kind, exc)
        return EpisodeStatus.INFRA_ERROR, f"{kind}: {exc}", VerifierReport(failure_mode=FailureMode.INFRA_ERROR,
                                                                          detail=str(exc))

    def _sandbox(self) -> AbstractAsyncContextManager[Sandbox]:
        if self._resume is not None:
            return contextlib.nullcontext(self._resume[1])  # the caller reattached it and destroys it
        return self._acquire(sandbox_request(self.spec.task))

    async def _in_sandbox(self, deadline: float) -> tuple[EpisodeStatus, str, VerifierReport]:
        async with self._sandbox() as sandbox:
            try:
                return await self._with_shell(sandbox, deadline)
            except SandboxLost as exc:  # T1's own sandbox service died with it: an infra error, whatever was done
                cause = await lost_cause(sandbox, exc)
                if cause is exc:
                    raise
                raise cause from exc

    async def _with_shell(self, sandbox: Sandbox, deadline: float) -> tuple[EpisodeStatus, str, VerifierReport]:
        task = self.spec.task
        shell = await sandbox.open_shell()
        try:
            if self._resume is not None:
                provisioned = self._resume[0].provisioned
                await shell.run(provisioned.prefix(), 30)
                if self._shell_state is not None:
                    await shell.run(restore(self._shell_state), 30)
                return await self._phases(sandbox, shell, provisioned, deadline)
            if self._journal is not None:
                self._journal.sandbox(id=sandbox.id, record=sandbox.record().to_json())
            provisioned = await provision(shell, task, self._sandboxes)
            await sandbox.end_setup()  # the verifier runs the system as setup left it, whatever the agent writes
            await shell.run(provisioned.prefix(), 30)
            return await self._phases(sandbox, shell, provisioned, deadline)
        finally:
            with contextlib.suppress(SandboxLost, OSError):
                await shell.close()

    async def _phases(self, sandbox: Sandbox, shell: Shell, provisioned: Provisioned, deadline: float
                      ) -> tuple[EpisodeStatus, str, VerifierReport]:
        task = self.spec.task
        if self._resume is None:
            if self.spec.limits.process_every_k:
                self._baseline = await self._verifier.baseline(sandbox, task.phases()[0], provisioned)
            if self._journal is not None:
                self._journal.ready(provisioned=provisioned_record(provisioned), baseline=self._baseline,
                                    tito=self.buf.resume_state())
        done: list[tuple[StepSpec, VerifierReport]] = []
        status, why = EpisodeStatus.OK, ""
        for i, phase in enumerate(task.phases()):
            self._phase = i
            if i > 0:
                await enter_step(shell, phase, provisioned)
                self._pending_obs.append({"role": "user", "content": phase.instruction})
            try:
                await self._loop(sandbox, shell, provisioned, phase, deadline)
            except _End as end:
                status, why = end.status, end.why
                self.tx.note(f"episode ends: {why}")
            report = await self._verifier.verify(sandbox, phase, provisioned, "final")
            if self.turns:  # the state after this phase's last turn (a K-th turn that ended the phase has no other)
                self._checkpoints[self.turns - 1] = report.passed
            done.append((phase, report))
            if status is not EpisodeStatus.OK or not passes_gate(report, phase.min_reward):
                break
        if not task.is_multi_step:
            return status, why, done[0][1]
        return status, why, combine_steps(done, task.multi_step_strategy, len(task.phases()))

    async def _loop(self, sandbox: Sandbox, shell: Shell, provisioned: Provisioned, phase: StepSpec,
                    deadline: float) -> None:
        limits = self.spec.limits
        bad_in_a_row = 0
        if self._resume is not None and self.turns == self._resume[0].turns:  # the first turns after a resume
            if self._resume[0].done:
                return
            bad_in_a_row = self._resume[0].bad_in_a_row
        while True:
            if self.turns >= limits.max_turns:
                self.tx.note(f"turn limit {limits.max_turns} reached")
                return
            if limits.max_bad_replies is not None and bad_in_a_row >= limits.max_bad_replies:
                self.tx.note(f"{bad_in_a_row} bad replies in a row: the episode ends")
                return
            if time.monotonic() >= deadline:
                raise _End(EpisodeStatus.TIMEOUT, "task wall-clock timeout")
            if self._journal is not None:
                await self._journal.room()  # the journal's writer keeps up: memory stays bounded
            await pace(limits.steps_per_loop_tick)  # the observation, the request: this turn's CPU
            if self._pending_obs:
                ask = self._fit.wants_summary(self.buf, self._pending_obs)
                self.buf.append_observation([*self._pending_obs, *([_SUMMARY_ASK] if ask else [])])
                self._pending_obs = []
                if ask:
                    await self._fit.by_summary(self.buf, lambda budget: self._summary(deadline, budget))
            self._fit.fit(self.buf)
            t_gen = time.monotonic()
            result, server_text = await self._generate_turn(deadline)
            self._generate_latency.observe(time.monotonic() - t_gen)
            await pace(limits.steps_per_loop_tick)  # decode, parse, the commands' start
            ids = result.token_ids.tolist()
            text = self._decoded(result, server_text)
            if self._journal is None:
                self._sampled.append((self.buf.num_segments - 1, len(self.buf.prompt_ids()),
                                      np.array(result.token_ids, np.int64)))
            # The buffer's default message is this same decoded text: handing it over saves a second decode.
            self.buf.append_generation(result, {"role": "assistant", "content": text})
            self.tx.turn(self.turns, text, len(ids), len(self.buf.prompt_ids()), result.policy_version,
                         str(result.finish_reason))
            parsed = self.spec.fmt.parse(text)
            outputs: list[str] = []
            if parsed.error is not None:
                m.BAD_REPLIES.labels(format=self.spec.fmt.name.value).inc()
                self.tx.note(f"bad reply: {parsed.error}")
            bad_in_a_row = bad_in_a_row + 1 if parsed.error is not None and not parsed.commands else 0
            if bad_in_a_row:
                self._bad_turns.append(self.turns)
            t_cmd = time.monotonic()
            ran: list[tuple[str, int | None]] = []
            for cmd in parsed.commands:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                timeout = min(cmd.timeout_s or remaining, remaining)
                res = await shell.run(cmd.text, timeout)
                self._commands.append(cmd.text, res.exit_code)
                ran.append((cmd.text, res.exit_code))
                self.tx.command(cmd.text, res.output, res.exit_code, res.duration_s, res.timed_out)
                outputs.append(format_output(cmd.text, res.output, res.exit_code, res.timed_out, res.truncated))
            self._commands_latency.observe(time.monotonic() - t_cmd)
            self.turns += 1
            m.ROLLOUT_TURNS.inc()
            k = limits.process_every_k
            if k and self.turns % k == 0 and not parsed.done:
                report = await self._verifier.verify(sandbox, phase, provisioned, f"turn {self.turns}")
                self._checkpoints[self.turns - 1] = report.passed
            done = parsed.done and parsed.error is None
            # Appended before the next generation, so a next phase's instruction can join it.
            self._pending_obs = [] if done else self.spec.fmt.observation(outputs, parsed.error)
            if self._journal is not None:
                self._journal.turn(turn=self.turns - 1, commands=ran, bad=bool(bad_in_a_row), done=done,
                                   checkpoint=self._checkpoints.get(self.turns - 1), observation=self._pending_obs,
                                   phase=self._phase, elapsed=round(time.monotonic() - self._t0, 3),
                                   tito=self.buf.resume_state(), shell=await self._probe(shell, ran))
            if done:
                return

    async def _probe(self, shell: Shell, ran: list[tuple[str, int | None]]) -> list[str] | None:
        """The shell's directory and exports for a resume, when this turn's commands may have changed them and they
        differ from the last journaled ones."""
        if not ran or not self._state_watch.wants_probe([text for text, _ in ran]):
            return None
        state = await probe(shell)
        if state is None or state == self._shell_state:
            return None
        self._shell_state = state
        return state.as_record()

    async def _summary(self, deadline: float, budget: int) -> str | None:
        """The policy's answer to the summary request, or None when it is malformed."""
        result, server_text = await self._generate_turn(deadline, budget)
        text = self._decoded(result, server_text)
        if self._journal is None:
            self._sampled.append((self.buf.num_segments - 1, len(self.buf.prompt_ids()),
                                  np.array(result.token_ids, np.int64)))
        self.buf.append_generation(result, {"role": "assistant", "content": text}, summary=True)
        parsed = self.spec.fmt.parse(text)
        summary = summary_of(text, result.finish_reason is FinishReason.LENGTH, bool(parsed.commands) or parsed.done)
        self.tx.note(f"compaction summary ({len(result.token_ids)} tokens"
                     f"{'' if summary is not None else ', malformed: the rule note instead'}): {text}")
        return summary

    def _decoded(self, result: GenerateResult, server_text: str | None) -> str:
        """A generation's text: the server's (a chat endpoint) or its ids decoded without the end-of-turn ids."""
        if server_text is not None:
            return server_text
        ids, eot = result.token_ids.tolist(), self._renderer.end_of_turn_ids
        return self._renderer.decode(ids[: len(ids) - len(eot)] if tuple(ids[-len(eot):]) == eot else ids)

    @property
    def text_level(self) -> bool:
        """The policy answers with text (a chat endpoint): the episode's ids are T1's tokenization of it."""
        return is_text_level(self._generate)

    async def _generate_turn(self, deadline: float, max_tokens: int | None = None
                             ) -> tuple[GenerateResult, str | None]:
        """One generation (and the server's text when it answers with text); failures are retried (the pool
        moves the session to a healthy replica). `max_tokens`: a budget below the run's (a summary's)."""
        prompt = self.buf.prompt_ids()
        budget = min(self.spec.limits.max_context_tokens - len(prompt), max_tokens or self.spec.sampling.max_tokens)
        sampling = self.spec.sampling
        if budget != sampling.max_tokens:  # a turn near the window's end, or a summary (its own budget)
            sampling = SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed,
                                      sampling.stop_token_ids, max(1, budget))
        req = GenerateRequest(self.session_id, np.asarray(prompt, np.int32), sampling)
        last: BaseException | None = None
        for attempt in range(self.spec.limits.turn_retries + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _End(EpisodeStatus.TIMEOUT, "task wall-clock timeout during generation")
            try:
                async with asyncio.timeout(remaining):
                    return await call_policy(self._generate, req, self.buf.messages, self._renderer.tools,
                                             self._renderer)
            except TimeoutError:
                raise _End(EpisodeStatus.TIMEOUT, "task wall-clock timeout during generation") from None
            except (ValueError, TypeError):
                raise  # a malformed request is a bug, not an infra failure
            except Exception as exc:  # the fault-tolerance point: retry the exact same context
                last = exc
                m.INFERENCE_RETRIES.inc()
                log.warning("episode %s turn %d: generate failed (try %d): %s", self.spec.episode_id, self.turns,
                            attempt + 1, exc)
        raise InferenceFailed(f"generate failed {self.spec.limits.turn_retries + 1} times: {last}")

    async def export(self, end: EpisodeEnd) -> EpisodeResult:
        """The reward, the exported trajectory and its TITO checks (off the event loop), the transcript's end."""
        try:
            return await self._export_result(end.status, end.why, end.report, end.duration_s)
        finally:
            self.close()

    async def _export_result(self, status: EpisodeStatus, why: str, report: VerifierReport, duration: float
                             ) -> EpisodeResult:
        spec = self.spec
        infra = status is EpisodeStatus.INFRA_ERROR
        penalty = spec.limits.bad_reply_penalty
        reward = 0.0 if infra else episode_reward(report, spec.reward_mode) - penalty * len(self._bad_turns)
        k = spec.limits.process_every_k
        turn_rewards = {} if infra or not k or not self.turns else self._process_rewards(k, report.passed)
        if turn_rewards and penalty:  # each malformed reply's own tokens carry its penalty
            for t in self._bad_turns:
                turn_rewards[t] = turn_rewards.get(t, 0.0) - penalty
        verifier = VerifierSummary(report.passed, report.total, tuple((t.name, t.status.value) for t in report.tests))
        # O(episode) pure work (routing concatenation, re-tokenization): off the event loop. Nothing else
        # touches this episode's buffer any more.
        if self._journal is not None:
            await self._journal.written()
        traj, (drift, drifted, changed, total) = await offload(self._export, status, reward, verifier, duration,
                                                               turn_rewards)
        m.EPISODES.labels(status=status.value).inc()
        if not infra:
            m.EPISODE_REWARD.observe(reward)
        failure = why or ("" if report.failure_mode is FailureMode.NONE else report.failure_mode.value)
        self.tx.footer(status.value, reward, self.turns, traj.num_tokens, duration, turn_rewards)
        return EpisodeResult(traj, report, self.turns, duration, failure, str(self.tx.path or ""), drift, changed,
                             total, self.text_level, drifted)

    def _process_rewards(self, every_k: int, final_passed: int) -> dict[int, float]:
        """Each checkpoint turn's change in passing verifiers; the last turn's checkpoint is the final verifier
        (it replaces a K-th check that fell on the last turn)."""
        turns = checkpoint_turns(self.turns, every_k)
        counts = [*(self._checkpoints[t] for t in turns[:-1]), final_passed]
        rewards = process_rewards(list(zip(turns, counts, strict=True)), self.turns, self._baseline)
        return {t: rewards[t] for t in turns}

    def _export(self, status: EpisodeStatus, reward: float, verifier: VerifierSummary, duration: float,
                turn_rewards: dict[int, float]) -> tuple[Trajectory, tuple[int, int, int, int]]:
        spec = self.spec
        replayed = None if self._journal is None else replay(self._journal.read())
        traj = self.buf.export(id=spec.episode_id, task_id=spec.task.id, group_id=spec.group_id,
                               attempt=spec.attempt, reward=reward, status=status, verifier=verifier,
                               timings=(("episode_s", duration),), turn_rewards=self.buf.by_generation(turn_rewards),
                               replayed=None if replayed is None else replayed.builders)
        return traj, trajectory_checks(traj, self._sampled if replayed is None else replayed.sampled, self._renderer)
