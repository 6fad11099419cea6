"""The episode's own cost: CPU per turn outside the model, shell and TITO buffer; loop lag when episodes end.

Run: .venv/bin/python bench/episode_cost.py [--episodes 8] [--turns 300] [--ending 50]
     .venv/bin/python bench/episode_cost.py --trees /tmp/old,. --rounds 2   (two versions, alternating)

Turns: episodes run the real loop (`t1.agent.episode.Episode._loop`, tool_calls format, transcript
on disk, metrics, compaction) against an in-process generate that replays tokenized replies of the
load benchmark's shape (prose + one bash tool call + <|im_end|>, 48 x top-8 uint8 routing) and a
shell that answers at once. CPU inside generate, the shell and the TokenBuffer is timed and
subtracted: `own_ms_per_turn` is what the episode itself costs (parsing, transcript, metrics,
bookkeeping); `excluded_ms_per_turn` is the rest.

Ending (--ending N): N such episodes are built, then all end at once through the real tail of a
training episode, `RolloutRunner.train_episode` after the loop: `Episode._finish` (TITO export with
routing concatenation, drift and re-tokenization checks), msgpack encode, `Spool.append` (fsync),
acknowledged at once. Meanwhile a sampler records how late 10 ms sleeps wake up (the event loop's
lag) and echo tasks count loopback round trips (how much of the loop the other episodes still get).

With --trees, each tree (a folder holding a `t1` package) runs in its own child process,
alternating over --rounds, so two versions of the code are compared in one noisy-machine run.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if "--tree" in sys.argv:  # before any t1 import: the child measures the tree's t1, not this checkout's
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--tree") + 1]).resolve()))
sys.path.insert(1, str(ROOT))


class Meter:
    """Process CPU seconds spent inside wrapped calls (the outermost call counts)."""

    def __init__(self) -> None:
        self.inside = 0.0
        self._depth = 0

    def wrap(self, fn: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            if self._depth:
                return fn(*a, **k)
            self._depth += 1
            t = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                self.inside += time.process_time() - t
                self._depth -= 1
        return timed


class Setup:
    """Renderer, task, replayed model replies and an instant shell, shared by both measurements."""

    def __init__(self, work: Path, transcripts: bool) -> None:
        import numpy as np

        from bench.load.episode import write_task
        from bench.sim_replies import LogprobPool, ModelShape, ReplyBook, ReplySettings, RoutingPool
        from t1.agent.formats import get_format
        from t1.coordinator.model_setup import make_renderers
        from t1.tasks.formats.dataset import load_task

        model = ROOT / ".t1/bench/tiny"
        self.fmt = get_format("tool_calls")
        self.renderer = make_renderers(model)[self.fmt.name]
        self.book = ReplyBook(model / "tokenizer.json", ReplySettings(min_tokens=150, max_tokens=290))
        self.routing = RoutingPool(ModelShape(num_layers=48, num_experts=128, top_k=8), rows=4096)
        self.logprobs = LogprobPool()
        self.task = load_task(write_task(work / "task"))
        self.tx_dir = work / "tx" if transcripts else None
        self.meter = Meter()
        self.rng = np.random.default_rng(0)
        self._seen: dict[str, int] = {}

    async def generate(self, req: Any) -> Any:
        import numpy as np

        from t1.inference.types import FinishReason, GenerateResult

        t = time.process_time()
        ids, _ = self.book.reply(self.rng)
        n, prompt = len(ids), len(req.prompt_ids)
        cached = min(self._seen.get(req.session_id, 0), prompt)
        self._seen[req.session_id] = prompt + n
        res = GenerateResult(token_ids=ids, logprobs=self.logprobs.take(n, self.rng), finish_reason=FinishReason.STOP,
                             policy_version=0, token_versions=np.zeros(n, np.int32),
                             routing=self.routing.block(cached, prompt + n - 1 - cached, self.rng),
                             prompt_tokens=prompt, cached_tokens=cached)
        self.meter.inside += time.process_time() - t
        return res

    def episode(self, i: int, turns: int) -> Any:
        from t1.agent.episode import Episode, EpisodeSpec
        from t1.agent.episode_limits import EpisodeLimits
        from t1.agent.transcript import Transcript
        from t1.config.loader import load_config
        from t1.inference.types import SamplingParams

        cfg = load_config(None, [f"rollout.max_turns={turns}", "rollout.max_context_tokens=32768"])
        limits = EpisodeLimits.from_config(cfg.rollout, cfg.reward)
        spec = EpisodeSpec(f"ep{i}", self.task, f"g{i}", 0, self.fmt,
                           SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=400), limits)
        ep = Episode(spec, self.generate, None, self.renderer,  # type: ignore[arg-type]
                     Transcript(self.tx_dir, self.task.id, spec.episode_id))
        for name in ("append_generation", "append_observation", "prompt_ids", "compact"):
            setattr(ep.buf, name, self.meter.wrap(getattr(ep.buf, name)))
        return ep

    async def play(self, ep: Any) -> None:
        from t1.sandbox.types import CommandResult

        class Shell:
            async def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
                return CommandResult(output="", exit_code=0, duration_s=0.001)

        ep.tx.header(self.task.id, ep.spec.episode_id, self.fmt.name.value, "instruction", len(ep.buf.prompt_ids()))
        await ep._loop(None, Shell(), None, self.task.phases()[0], time.monotonic() + 1e6)


async def finish(ep: Any) -> Any:
    from t1.tasks.verify.report import VerifierReport
    from t1.trajectory.types import EpisodeStatus

    done = ep._finish(EpisodeStatus.OK, "", VerifierReport(), 1.0)
    return await done if inspect.isawaitable(done) else done  # a coroutine once its work left the loop


async def measure_turns(setup: Setup, episodes: int, turns: int) -> dict[str, Any]:
    eps = [setup.episode(i, turns) for i in range(episodes)]
    t0 = time.process_time()
    await asyncio.gather(*(setup.play(ep) for ep in eps))
    total = time.process_time() - t0
    n = sum(ep.turns for ep in eps)
    for ep in eps:
        ep.tx.close()
    return {"turns": n, "own_ms_per_turn": 1e3 * (total - setup.meter.inside) / n,
            "excluded_ms_per_turn": 1e3 * setup.meter.inside / n}


async def echo_load(stop: asyncio.Event, counter: list[int]) -> None:
    """One loopback round trip after another: what a stalled loop denies every other episode."""
    a, b = socket.socketpair()
    ra, wa = await asyncio.open_connection(sock=a)
    rb, wb = await asyncio.open_connection(sock=b)
    try:
        while not stop.is_set():
            wa.write(b"x" * 64)
            wb.write(await rb.readexactly(64))
            await ra.readexactly(64)
            counter[0] += 1
    finally:
        wa.close()
        wb.close()


async def measure_ending(setup: Setup, work: Path, n: int, turns: int) -> dict[str, Any]:
    from t1.coordinator.rollout.runner import RolloutRunner, RolloutStats
    from t1.coordinator.spool.trajectory_spool import Spool

    eps = [setup.episode(1000 + i, turns) for i in range(n)]
    await asyncio.gather(*(setup.play(ep) for ep in eps))
    spool = Spool.open(work / "spool", max_bytes=1 << 40, segment_bytes=256 << 20, fsync=True)
    sizes: list[int] = []

    async def acker() -> None:
        with spool.cursor() as cursor:
            while True:
                rec = await cursor.next()
                sizes.append(rec.size)
                spool.ack(rec.trajectory_id)

    # The real tail of a training episode: train_episode after its episode has run.
    runner = RolloutRunner.__new__(RolloutRunner)
    runner.stats = RolloutStats()
    ready = {ep.spec.group_id: ep for ep in eps}
    eps.clear()

    async def run_episode(task: Any, group_id: str, attempt: int, options: Any = None) -> Any:
        return await finish(ready.pop(group_id))

    runner.run_episode = run_episode  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    stop, echoes = asyncio.Event(), [0]

    async def sampler() -> None:
        while not stop.is_set():
            due = loop.time() + 0.01
            await asyncio.sleep(0.01)
            lags.append(loop.time() - due)

    ack_task = asyncio.create_task(acker())
    probes = [asyncio.create_task(sampler())] + [asyncio.create_task(echo_load(stop, echoes)) for _ in range(8)]
    await asyncio.sleep(0.5)
    base_echoes, echoes[0] = echoes[0], 0
    del lags[:]
    cpu0, t0 = time.process_time(), time.monotonic()
    await asyncio.gather(*(runner.train_episode(setup.task, g, 0, spool)  # type: ignore[arg-type]
                           for g in list(ready)))
    while len(sizes) < n:
        await asyncio.sleep(0.01)
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    stop.set()
    await asyncio.gather(*probes)
    ack_task.cancel()
    spool.close()
    lags.sort()
    return {"ending": n, "trajectory_mb": sum(sizes) / n / 1e6, "burst_wall_s": wall, "burst_cpu_s": cpu,
            "lag_p50_ms": 1e3 * lags[len(lags) // 2], "lag_p99_ms": 1e3 * lags[int(0.99 * (len(lags) - 1))],
            "lag_max_ms": 1e3 * lags[-1], "echo_per_s_idle": base_echoes / 0.5, "echo_per_s_burst": echoes[0] / wall}


def child(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="t1-episode-cost-"))
    if args.switch_ms:
        sys.setswitchinterval(args.switch_ms / 1e3)
    try:
        setup = Setup(work, not args.no_transcripts)
        out: dict[str, Any] = {}
        if args.episodes:
            out.update(asyncio.run(measure_turns(setup, args.episodes, args.turns)))
        if args.ending:
            out.update(asyncio.run(measure_ending(setup, work, args.ending, args.turns)))
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compare(args: argparse.Namespace) -> None:
    trees = args.trees.split(",")
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
    for _ in range(args.rounds):
        for tree in trees:
            cmd = [
                sys.executable,
                __file__,
                "--tree",
                tree,
                "--episodes",
                str(args.episodes),
                "--turns",
                str(args.turns),
                "--ending",
                str(args.ending),
                "--switch-ms",
                str(args.switch_ms),
            ] + (["--no-transcripts"] if args.no_transcripts else [])
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=dict(os.environ)).stdout
            runs[tree].append(json.loads(out.strip().splitlines()[-1]))
            print(tree, json.dumps(runs[tree][-1]), flush=True)
    for tree, rs in runs.items():
        keys = rs[0].keys()
        print(f"{tree}: " + ", ".join(f"{k} {' / '.join(f'{r[k]:.3g}' for r in rs)}" for k in keys))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=8, help="episodes for the per-turn measurement (0: skip it)")
    p.add_argument("--turns", type=int, default=300)
    p.add_argument("--ending", type=int, default=0, help="episodes that end at once (0: skip)")
    p.add_argument("--no-transcripts", action="store_true")
    p.add_argument("--switch-ms", type=float, default=0.0, help="the interpreter's GIL switch interval (0: as is)")
    p.add_argument("--tree", help="folder holding the t1 package to measure (child mode)")
    p.add_argument("--trees", help="comma-separated trees to compare, alternating")
    p.add_argument("--rounds", type=int, default=2)
    return p.parse_args()


if __name__ == "__main__":
    a = parse_args()
    if a.trees:
        compare(a)
    else:
        print(json.dumps(child(a)))
