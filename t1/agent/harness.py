"""A harness episode: the user's own agent process runs in the sandbox and calls the episode's gateway.

    sandbox + shell -> provision -> end_setup        (as T1's own loop: Episode)
    each phase:  gateway on 127.0.0.1:PORT inside the sandbox (t1.sandbox.loopback_port), a fresh key
                 the harness command runs in the agent's shell until it exits or times out
                 (OPENAI_BASE_URL / ANTHROPIC_BASE_URL / *_API_KEY, the instruction in $T1_INSTRUCTION_FILE)
    end:         verifiers -> reward (as T1's own loop) -> the trajectory is the gateway's record:
                 every call's exact ids, logprobs, versions and routing, segments counted by cause

Only the agent part differs from T1's loop, so this is an Episode whose `_loop` runs the harness
and whose export takes the gateway's segments. The harness's own exit code and output are its
business (kept in the transcript); its timeout ends the episode as `timeout`; generation failing
past the retries is an infra error, as in T1's loop.
"""

from __future__ import annotations

import math
import secrets
import shlex
import time
from collections import Counter

from t1.agent.episode import Episode
from t1.agent.episode_types import EpisodeSpec, InferenceFailed, SandboxAcquire, _End
from t1.agent.transcript import Transcript
from t1.config.rollout import HarnessConfig
from t1.gateway.renderers import ToolRenderers
from t1.gateway.server import GatewayServer
from t1.gateway.session import GatewaySession
from t1.inference.types import GenerateFn
from t1.sandbox.loopback_port import SandboxPorts
from t1.sandbox.types import LOCAL_TRAITS, Sandbox, SandboxTraits, Shell
from t1.tasks.provision import Provisioned
from t1.tasks.spec import StepSpec
from t1.tito import ChatRenderer
from t1.tito.diagnostics import retokenize_mismatch
from t1.trajectory.types import EpisodeStatus, Trajectory, VerifierSummary

INSTRUCTION_FILE = "/tmp/t1-instruction.md"
OUTPUT_FILE = "/tmp/t1-harness.log"
KILL_AFTER_S = 10  # the harness's grace between TERM and KILL at its timeout
SHELL_SLACK_S = 30  # the shell's own timeout beyond the harness's (the wrapper ends it first)


def harness_env(cfg: HarnessConfig, key: str) -> dict[str, str]:
    """What the harness finds in its environment (the config's `env` last: it may override any)."""
    base = f"http://127.0.0.1:{cfg.port}"
    return {"OPENAI_BASE_URL": f"{base}/v1", "OPENAI_API_BASE": f"{base}/v1", "OPENAI_API_KEY": key,
            "ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": key, "T1_GATEWAY_URL": base, "T1_GATEWAY_KEY": key,
            "T1_MODEL": cfg.model_name, "T1_INSTRUCTION_FILE": INSTRUCTION_FILE, **cfg.env}


def harness_command(cfg: HarnessConfig, key: str, timeout_s: float) -> str:
    """The shell line that runs the harness (pure): its environment, its time limit (TERM, then KILL),
    its output into a file whose tail is printed, and its exit code kept."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in harness_env(cfg, key).items())
    limit = max(1, math.ceil(timeout_s))
    return (f"cd /app 2>/dev/null || cd /; env {exports} timeout -k {KILL_AFTER_S} {limit} "
            f"bash -c {shlex.quote(cfg.command)} > {OUTPUT_FILE} 2>&1 < /dev/null; t1_rc=$?; "
            f"tail -c {cfg.output_cap_bytes} {OUTPUT_FILE}; (exit $t1_rc)")


class HarnessEpisode(Episode):
    """An Episode whose agent is the configured harness talking to the episode's gateway."""

    def __init__(self, spec: EpisodeSpec, generate: GenerateFn, acquire: SandboxAcquire, renderer: ChatRenderer,
                 transcript: Transcript, *, ports: SandboxPorts, harness: HarnessConfig,
                 sandboxes: SandboxTraits = LOCAL_TRAITS, tool_renderers: ToolRenderers | None = None) -> None:
        super().__init__(spec, generate, acquire, renderer, transcript, sandboxes=sandboxes)
        self._ports = ports
        self._harness = harness
        self.gateway = GatewaySession(spec.episode_id, generate, tool_renderers or renderer, spec.sampling, harness,
                                      spec.limits.max_context_tokens, spec.limits.turn_retries)

    @property
    def segment_causes(self) -> Counter[str]:
        """Segments started by the gateway's calls, by cause (`t1.gateway.session.SegmentCause`)."""
        return Counter(self.gateway.causes)

    def _end_session(self) -> None:
        self.gateway.end()

    async def _loop(self, sandbox: Sandbox, shell: Shell, provisioned: Provisioned, phase: StepSpec,
                    deadline: float) -> None:
        cfg = self._harness
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _End(EpisodeStatus.TIMEOUT, "task wall-clock timeout before the harness started")
        limit = min(cfg.timeout_s or remaining, remaining)
        key = secrets.token_urlsafe(32)
        server = GatewayServer(self.gateway, key, cfg.model_name)
        await server.serve(await self._ports.listen_inside(sandbox.id, cfg.port))
        first_call = self.gateway.calls
        try:
            await shell.write_file(INSTRUCTION_FILE, phase.instruction.encode(), 0o644)
            t0 = time.monotonic()
            try:
                res = await shell.run(harness_command(cfg, key, limit), limit + KILL_AFTER_S + SHELL_SLACK_S)
            finally:
                self._commands.append(cfg.command, None)  # the agent has acted, whatever happened after
            duration = time.monotonic() - t0
        finally:
            await server.close()
        self.turns = self.gateway.calls
        self._transcribe_calls(first_call)
        self.tx.command(cfg.command, res.output, res.exit_code, duration, res.timed_out)
        refused = ", ".join(f"{n} {why}" for why, n in sorted(server.refused.items()))
        if refused:
            self.tx.note(f"gateway refused requests: {refused}")
        if self.gateway.inference_failed is not None:
            raise InferenceFailed(self.gateway.inference_failed)
        if res.timed_out or (res.exit_code in (124, 137) and duration >= limit):  # timeout: TERM, then KILL
            raise _End(EpisodeStatus.TIMEOUT, f"the harness ran past its {limit:.0f}s limit")

    def _transcribe_calls(self, first: int) -> None:
        for r in self.gateway.records[first:]:
            how = f"new segment ({r.cause})" if r.cause else "continues the segment"
            self.tx.note(f"gateway call {r.index}: {how}; prompt {r.prompt_tokens} tokens (+{r.new_tokens}), "
                         f"sampled {r.completion_tokens}, {r.stop}; sampling {r.used}"
                         + (f"; asked {r.asked}" if r.asked else ""))

    def _export(self, status: EpisodeStatus, reward: float, verifier: VerifierSummary, duration: float,
                turn_rewards: dict[int, float]) -> tuple[Trajectory, tuple[int, int, int, int]]:
        spec = self.spec
        segments, drift, counters = self.gateway.segments()
        traj = Trajectory(id=spec.episode_id, task_id=spec.task.id, group_id=spec.group_id, attempt=spec.attempt,
                          segments=segments, reward=reward, status=status, verifier=verifier,
                          timings=(("episode_s", duration),), tito=counters)
        changed = total = 0
        for seg in segments:
            c, t = retokenize_mismatch(seg, self._renderer.encode, self._renderer.decode)
            changed, total = changed + c, total + t
        return traj, (drift, int(drift > 0), changed, total)  # the gateway counts drift per episode: >= 1 segment
