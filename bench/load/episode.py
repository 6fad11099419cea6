"""Load-test episodes: the coordinator's Scheduler and RolloutRunner behind thin measuring wrappers.

The coordinator's own rollout path runs unchanged: `Scheduler` admits groups under a global
concurrency limit, `RolloutRunner.train_episode` builds the `t1.agent.episode.Episode` (TITO,
tool-call format, compaction, transcript, verifier), runs it with the InferencePool (gRPC to the
simulated server) and a SandboxPool (real SSH to the sandbox host), encodes the trajectory and
appends it to the fsynced Spool. The wrappers here only observe:

    MeasuredGenerate  (GenerateFn)       turn boundaries, model time, live token counts, the stop signal
    MeasuredProvider  (SandboxProvider)  under the SandboxPool; throttles creation, times every command
    TimedSpool        (spool.append)     payload size and append time of each trajectory
    LoadRun.attempt   (AttemptFn)        what the Scheduler launches: one measured training episode

When the measurement ends, generate raises StopLoad; the Episode counts it as an inference
failure, ends as infra_error and still exports its full trajectory, which is spooled as usual.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.load.metrics import TurnClock
from bench.sim_inference import Latency
from t1.coordinator.rollout.runner import RolloutRunner
from t1.coordinator.spool.trajectory_spool import Spool
from t1.inference.types import GenerateFn, GenerateRequest, GenerateResult
from t1.sandbox.types import (
    CommandResult,
    Sandbox,
    SandboxProvider,
    SandboxRequest,
    SandboxTraits,
    Shell,
    ShellRole,
)
from t1.tasks.spec import TaskSpec

CURRENT_EPISODE: contextvars.ContextVar[str] = contextvars.ContextVar("bench_episode", default="")


class StopLoad(RuntimeError):
    """The measurement is over; raised by MeasuredGenerate so every episode ends and exports."""


def model_seconds(latency: Latency, result: GenerateResult) -> float:
    """What the simulated server slept for this request (its latency formula on the request's counts)."""
    prefill = result.prompt_tokens - result.cached_tokens
    return latency.per_request_s + latency.per_prefill_token_s * prefill + latency.per_token_s * len(result.token_ids)


@dataclass(slots=True)
class LiveState:
    """Which episodes are running and how many trajectory tokens each holds (for RSS accounting)."""

    started: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    tokens: dict[str, tuple[int, int]] = field(default_factory=dict)  # session -> (tokens, routing rows)
    turn_of: dict[str, int] = field(default_factory=dict)  # live episode -> turns generated so far

    @property
    def live(self) -> int:
        return len(self.started - self.finished)

    def trajectory_bytes(self, routing_bytes_per_token: int) -> int:
        """ids, logprobs, mask, versions and the ids cache (17 B/token) plus routing rows, of live sessions."""
        return sum(t * 17 + r * routing_bytes_per_token for t, r in self.tokens.values())


class MeasuredGenerate:
    """A GenerateFn around the InferencePool that feeds the TurnClock and stops the load on request."""

    def __init__(self, inner: GenerateFn, latency: Latency, clock: TurnClock, live: LiveState,
                 stop: asyncio.Event, gate: asyncio.Event | None = None) -> None:
        self.inner, self.latency, self.clock, self.live, self.stop = inner, latency, clock, live, stop
        self.gate = gate  # while unset, first turns wait: the ramp-up spends its CPU on sandboxes only

    async def __call__(self, request: GenerateRequest) -> GenerateResult:
        if self.stop.is_set():
            raise StopLoad("load test over")
        episode = CURRENT_EPISODE.get()
        self.live.started.add(episode)
        if self.gate is not None:
            await self.gate.wait()
        self.clock.generate_started(episode)
        self.live.turn_of[episode] = self.live.turn_of.get(episode, 0) + 1
        result = await self.inner(request)
        self.clock.model(episode, model_seconds(self.latency, result))
        rows = result.routing.num_tokens if result.routing is not None else 0
        _, rows_before = self.live.tokens.get(request.session_id, (0, 0))
        self.live.tokens[request.session_id] = (result.prompt_tokens + len(result.token_ids), rows_before + rows)
        return result


class TimedShell:
    """A Shell whose commands report their round trip to the TurnClock."""

    def __init__(self, inner: Shell, clock: TurnClock) -> None:
        self.inner, self.clock = inner, clock

    async def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        t0 = time.monotonic()
        try:
            return await self.inner.run(command, timeout_s)
        finally:
            self.clock.command(CURRENT_EPISODE.get(), time.monotonic() - t0)

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        await self.inner.write_file(path, data, mode)

    async def read_file(self, path: str) -> bytes:
        return await self.inner.read_file(path)

    async def close(self) -> None:
        await self.inner.close()


class TimedSandbox:
    """A Sandbox whose shells are TimedShells."""

    def __init__(self, inner: Sandbox, clock: TurnClock) -> None:
        self.inner, self.clock = inner, clock

    @property
    def id(self) -> str:
        return self.inner.id

    async def open_shell(self, *, terminal: bool = False, role: ShellRole = ShellRole.AGENT) -> Shell:
        return TimedShell(await self.inner.open_shell(terminal=terminal, role=role), self.clock)

    async def end_setup(self) -> None:
        await self.inner.end_setup()

    async def upload(self, local_path: str, remote_path: str) -> None:
        await self.inner.upload(local_path, remote_path)

    async def download(self, remote_path: str, local_path: str) -> None:
        await self.inner.download(remote_path, local_path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class MeasuredProvider:
    """A SandboxProvider wrapper: at most `max_creating` creations at once, timed shells."""

    def __init__(self, inner: SandboxProvider, clock: TurnClock, max_creating: int = 16) -> None:
        self.inner, self.clock = inner, clock
        self._creating = asyncio.Semaphore(max_creating)

    @property
    def traits(self) -> SandboxTraits:
        return self.inner.traits

    async def create(self, request: SandboxRequest) -> Sandbox:
        async with self._creating:
            return TimedSandbox(await self.inner.create(request), self.clock)

    async def destroy(self, sandbox: Sandbox) -> None:
        await self.inner.destroy(sandbox.inner if isinstance(sandbox, TimedSandbox) else sandbox)

    async def close(self) -> None:
        await self.inner.close()


class TimedSpool:
    """The spool as RolloutRunner.train_episode sees it: every append is timed and sized."""

    def __init__(self, inner: Spool) -> None:
        self.inner = inner
        self.appends: dict[str, tuple[int, float]] = {}  # trajectory id -> (payload bytes, seconds)

    async def append(self, trajectory_id: str, payload: bytes) -> bool:
        t0 = time.monotonic()
        accepted = await self.inner.append(trajectory_id, payload)
        self.appends[trajectory_id] = (len(payload), time.monotonic() - t0)
        return accepted


@dataclass(slots=True)
class LoadRun:
    """The AttemptFn the coordinator's Scheduler launches: one RolloutRunner training episode, measured."""

    runner: RolloutRunner
    spool: TimedSpool
    live: LiveState
    clock: TurnClock
    stop_after: int | None = None          # quick mode: stop admission once this many episodes started
    on_stop_after: Callable[[], None] | None = None
    tokens: dict[str, int] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    launched: int = 0

    async def attempt(self, task: TaskSpec, group_id: str, index: int) -> None:
        episode_id = f"{group_id}-a{index}"  # the id RolloutRunner gives a training episode
        CURRENT_EPISODE.set(episode_id)
        self.launched += 1
        if self.stop_after is not None and self.launched == self.stop_after and self.on_stop_after is not None:
            self.on_stop_after()
        try:
            result = await self.runner.train_episode(task, group_id, index, self.spool)  # type: ignore[arg-type]
        except Exception as exc:  # the bench's fault-tolerance point: count it, keep the other episodes going
            self.errors.append(f"{episode_id}: {type(exc).__name__}: {exc}")
            return
        finally:
            self.live.finished.add(episode_id)
            self.live.turn_of.pop(episode_id, None)
            self.clock.end(episode_id)
            for session in [s for s in self.live.tokens if s.startswith(episode_id + "/")]:
                del self.live.tokens[session]
        self.tokens[result.trajectory.id] = result.trajectory.num_tokens
        self.statuses[result.status.value] += 1

    def spooled(self) -> list[tuple[int, int, float]]:
        """(payload bytes, tokens, append seconds) of every spooled trajectory."""
        return [(b, self.tokens[tid], s) for tid, (b, s) in self.spool.appends.items() if tid in self.tokens]


async def ack_everything(spool: Spool) -> None:
    """Stands in for a trainer that keeps up: acknowledges each trajectory as the cursor yields it."""
    with spool.cursor() as cursor:
        while True:
            record = await cursor.next()
            spool.ack(record.trajectory_id)


def write_task(root: Path, context: str = "") -> Path:
    """A Harbor-format task whose verifier always passes: the load is the agent loop, not the task.

    `context` (a file listing, say) is appended to the instruction, so every prompt starts that long."""
    (root / "tests").mkdir(parents=True, exist_ok=True)
    (root / "task.toml").write_text('[task]\nname = "load"\n[agent]\ntimeout_sec = 86400\n[verifier]\n'
                                    'timeout_sec = 60\n')
    (root / "instruction.md").write_text(
        "The repository in /app has a failing test in tests/test_parse.py. Find the bug in the parser, "
        "fix it, and make sure every test passes. Do not change the tests.\n" + context)
    (root / "tests" / "test.sh").write_text("#!/bin/bash\nmkdir -p /logs/verifier\n"
                                            "echo 1 > /logs/verifier/reward.txt\n")
    return root


def listing(tokens: int, encode: Callable[[str], list[int]]) -> str:
    """A repository listing of at least `tokens` tokens, for prompts that start deep from the first turn."""
    if tokens <= 0:
        return ""
    parts, n, i = ["\nFiles in /app:\n"], 0, 0
    while n < tokens:
        block = "".join(f"src/pkg_{j % 97:02d}/module_{j:05d}.py  {(j * 7919) % 90000 + 120} bytes\n"
                        for j in range(i, i + 200))
        parts.append(block)
        n += len(encode(block))
        i += 200
    return "".join(parts)
