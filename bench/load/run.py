"""Load test of the coordinator's rollout path: thousands of concurrent episodes over real SSH, gRPC, TITO, spool.

    bench/load/run.py process (measured: "coordinator")              child processes (measured apart)
    +---------------------------------------------------+        +-------------------------------+
    | Scheduler (groups, limit N) -> RolloutRunner      |        | bench.sim_inference           |
    |   -> Episode: TokenBuffer, tool_calls, transcript |--gRPC->|  InferenceService, 48 x top-8 |
    |   InferencePool (MeasuredGenerate)                |        |  routing, simulated latency   |
    |   SandboxPool -> SshSandbox -> SshShell           |--SSH-->| bench.sandbox_host            |
    |   codec -> Spool (fsync) -> acking cursor         |        |  embedded sshd + bubblewrap   |
    | LagSampler, ProcessMeter, TurnClock               |        |  + one bash per episode       |
    +---------------------------------------------------+        +-------------------------------+

Per scale: the scheduler keeps N episodes running (a finished one is replaced). Each acquires a
sandbox and opens its shell; first turns wait until all N are provisioned, so the ramp-up spends
its CPU on sandboxes. After a warm-up the window measures turns/s, CPU per turn of each process,
turn overhead (turn wall minus model and command time), event-loop lag, and RSS per live episode
without its trajectory arrays. Then every episode is stopped (it ends as infra_error and is
spooled like any other), which gives trajectory bytes per token and spool throughput.

    .venv/bin/python -m bench.load --quick
    .venv/bin/python -m bench.load --scales 100,1000,4000 --window-s 60 --out bench/results/load.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.load.metrics import GcPauses, LagSampler, ProcessMeter, TurnClock, gc_census
from bench.load.report import print_table, scale_result
from bench.machine_info import machine
from bench.sandbox_host import peer_command
from bench.sim_inference import Latency

log = logging.getLogger("bench.load")
REPO_ROOT = Path(__file__).resolve().parents[2]  # where `python -m bench.<module>` finds the bench package
STOP_WAIT_S = 3600.0  # how long the episodes in flight may take to end after the stop
PATH = ("t1.coordinator.rollout.scheduler.Scheduler (groups, global concurrency limit) -> "
        "t1.coordinator.rollout.runner.RolloutRunner.train_episode -> t1.agent.episode.Episode (provision, TITO, "
        "tool_calls format, compaction, transcript, verifier) with t1.inference.client.pool.InferencePool over gRPC "
        "to bench.sim_inference (child process) and t1.sandbox.pool.SandboxPool -> SshSandbox/SshShell to the "
        "embedded sshd + bubblewrap (bench.sandbox_host, child process); trajectories encoded with "
        "t1.trajectory.serialization into t1.coordinator.spool.trajectory_spool.Spool (fsync), acknowledged by a "
        "cursor consumer standing in for the trainer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scales", default="100,1000,4000", help="comma-separated concurrent episode counts")
    p.add_argument("--turns", type=int, default=300, help="turns per episode")
    p.add_argument("--group-size", type=int, default=8, help="attempts per task (the scheduler's G)")
    p.add_argument("--window-s", type=float, default=60.0, help="measurement window per scale (not with --once)")
    p.add_argument("--timeline-s", type=float, default=10.0, help="interval of the CPU-per-turn timeline")
    p.add_argument("--warmup-s", type=float, default=10.0, help="time after every episode is live, before measuring")
    p.add_argument("--shell", choices=["fast", "bash"], default="fast",
                   help="fast: the model runs `true`; bash: a mix of real commands")
    p.add_argument("--per-request-ms", type=float, default=50.0)
    p.add_argument("--per-token-ms", type=float, default=20.0)
    p.add_argument("--per-prefill-token-ms", type=float, default=0.02)
    p.add_argument("--chunk-tokens", type=int, default=64,
                   help="tokens per streamed chunk of a Generate call (--transport calls); 0: one chunk per reply")
    p.add_argument("--linger-ms", type=float, default=0.0,
                   help="GenerateBatched linger on both ends (inference.pool/server.batch_linger_ms)")
    p.add_argument("--reply-max-mb", type=float, default=0.0,
                   help="GenerateBatched: most MB of results per reply message of the simulated server (0: default)")
    p.add_argument("--transport", choices=["batched", "calls"], default="batched",
                   help="batched: one GenerateBatched stream (the pool's default); calls: a Generate call per turn")
    p.add_argument("--no-prompt-deltas", action="store_true",
                   help="every request carries its whole prompt (inference.pool.prompt_deltas: false)")
    p.add_argument("--context-tokens", type=int, default=0,
                   help="a listing of about this many tokens in the instruction: every prompt starts this deep")
    p.add_argument("--min-tokens", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--max-context-tokens", type=int, default=32768)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--model", type=Path, default=Path(".t1/bench/tiny"),
                   help="model folder whose tokenizer both sides use (made with the tiny preset if missing)")
    p.add_argument("--creates-per-s", type=float, default=100.0, help="sandbox creation rate during ramp-up")
    p.add_argument("--no-bubblewrap", action="store_true", help="sandbox sessions without bubblewrap")
    p.add_argument("--sandbox-hosts", type=int, default=0,
                   help="sandbox host processes to spread the sandboxes over (0: as few as open-files limits allow)")
    p.add_argument("--no-transcripts", action="store_true", help="do not write per-episode transcripts")
    p.add_argument("--no-journal", action="store_true",
                   help="episodes keep their trajectory arrays in memory (coordinator.journal.enabled: false)")
    p.add_argument("--journal-fsync-ms", type=int, default=0, help="coordinator.journal.fsync_window_ms")
    p.add_argument("--steps-per-tick", type=int, default=None,
                   help="rollout.steps_per_loop_tick (episode steps started per loop iteration; 0: no pacing)")
    p.add_argument("--gc-full-interval-s", type=float, default=300.0,
                   help="as coordinator.gc_full_interval_s: full collections on this schedule; 0: CPython's policy")
    p.add_argument("--peer-nice", type=int, default=0,
                   help="nice value of the simulated inference server and the sandbox host (and its shells): they "
                        "stand in for other machines, and a positive value keeps them from taking the "
                        "coordinator's CPU when the machine is saturated")
    p.add_argument("--once", action="store_true",
                   help="run each of the N episodes to its turn limit (no replacement); measure until the last ends")
    p.add_argument("--quick", action="store_true",
                   help="10 episodes x 5 turns, fast latencies, measured from launch to the last episode's end")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.quick:
        args.scales, args.turns, args.warmup_s = "10", 5, 0.0
        args.per_request_ms, args.per_token_ms = 5.0, 0.1
    args.scale_list = [int(s) for s in str(args.scales).split(",") if s.strip()]
    if not args.scale_list or min(args.scale_list) < 1:
        p.error(f"--scales needs positive integers, got {args.scales!r}")
    return args


def ensure_model(path: Path) -> Path:
    if not (path / "tokenizer.json").is_file():
        from t1.model.init import init_model

        init_model(path, "tiny", seed=0)
    return path


async def start_sim(args: argparse.Namespace, workdir: Path) -> tuple[asyncio.subprocess.Process, int]:
    ready = workdir / "sim.port"
    argv = [sys.executable, "-m", "bench.sim_inference", "--tokenizer", str(args.model / "tokenizer.json"),
            "--ready-file", str(ready), "--commands", args.shell, "--min-tokens", str(args.min_tokens),
            "--max-tokens", str(args.max_tokens), "--per-request-ms", str(args.per_request_ms),
            "--per-token-ms", str(args.per_token_ms), "--per-prefill-token-ms", str(args.per_prefill_token_ms),
            "--chunk-tokens", str(args.chunk_tokens), "--linger-ms", str(args.linger_ms),
            "--reply-max-mb", str(args.reply_max_mb), "--layers", str(args.layers),
            "--experts", str(args.experts), "--top-k", str(args.top_k)]
    proc = await asyncio.create_subprocess_exec(*peer_command(argv, getattr(args, "peer_nice", 0)), cwd=str(REPO_ROOT))
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError(f"simulated inference server did not start (code {proc.returncode})")
        await asyncio.sleep(0.05)
    return proc, int(ready.read_text())


def load_config(args: argparse.Namespace, episodes: int) -> Any:
    """The coordinator's config for `episodes` concurrent episodes: rollout limits and sampling, a
    sandbox pool and a concurrency limit of that size, the inference transport under test, a spool
    that never holds rollouts back (an acker drains it), and no policy-lag or step gating."""
    from t1.config.loader import validate

    return validate({
        "rollout": {
            "max_turns": args.turns, "max_context_tokens": args.max_context_tokens, "group_size": args.group_size,
            "max_concurrent_episodes": episodes,
            "sampling": {"max_tokens": args.max_tokens + 16}, "transcripts": not args.no_transcripts,
            **({"steps_per_loop_tick": args.steps_per_tick} if args.steps_per_tick is not None else {})},
        "sandbox": {"pool": {"max_sandboxes": episodes, "max_creates_per_s": args.creates_per_s,
                             "acquire_timeout_s": 3600}},
        "inference": {"pool": {"request_timeout_s": 600.0, "batched_stream": args.transport == "batched",
                               "batch_linger_ms": args.linger_ms, "prompt_deltas": not args.no_prompt_deltas}},
        "coordinator": {"spool": {"max_mb": 1 << 20}},
        "trainer": {"rl": {"max_policy_lag": 0, "groups_per_step": 1 << 40}},
    })


async def run_scale(args: argparse.Namespace, episodes: int, workdir: Path) -> dict[str, Any]:
    from bench.load.episode import (
        LiveState,
        LoadRun,
        MeasuredGenerate,
        MeasuredProvider,
        TimedSpool,
        ack_everything,
        listing,
        write_task,
    )
    from bench.sandbox_host import HostGroup
    from t1.config.sandbox import ShellConfig
    from t1.coordinator.model_setup import make_renderers
    from t1.coordinator.rollout.runner import RolloutRunner
    from t1.coordinator.run.gc_policy import GcSchedule
    from t1.coordinator.run.parts import make_scheduler, open_spool
    from t1.coordinator.spool.journal import Journal
    from t1.inference.client.pool import InferencePool
    from t1.rpc.loop import freeze_long_lived
    from t1.sandbox.pool import SandboxPool
    from t1.tasks.formats.dataset import load_task

    sim, port = await start_sim(args, workdir)
    host = HostGroup(workdir / "sandboxes", ShellConfig(), sandbox_hosts(episodes, args.sandbox_hosts),
                     bubblewrap=not args.no_bubblewrap, log_file=workdir / "sandbox_host.log", nice=args.peer_nice)
    await host.start()
    cfg = load_config(args, episodes)
    spool = open_spool(cfg, workdir)
    pool = InferencePool(cfg.inference.pool, [f"127.0.0.1:{port}"])
    latency = Latency(args.per_request_ms / 1e3, args.per_prefill_token_ms / 1e3, args.per_token_ms / 1e3)
    clock, live, stop = TurnClock(), LiveState(), asyncio.Event()
    gate = None if args.quick else asyncio.Event()
    generate = MeasuredGenerate(pool, latency, clock, live, stop, gate)
    sandboxes = SandboxPool(MeasuredProvider(host, clock), cfg.sandbox.pool)
    renderers = make_renderers(args.model)
    context = listing(args.context_tokens, next(iter(renderers.values())).encode)
    journal = None if args.no_journal else Journal.open(workdir / "journal", args.journal_fsync_ms / 1000)
    runner = RolloutRunner(cfg, renderers, sandboxes.acquire, lambda job, task, fmt: generate,
                           None if args.no_transcripts else workdir / "transcripts", journal=journal)
    task = load_task(write_task(workdir / "task", context))
    scheduler = make_scheduler(cfg, asyncio.Semaphore(cfg.rollout.max_concurrent_episodes), spool)
    finite = args.quick or args.once
    run = LoadRun(runner, TimedSpool(spool), live, clock, stop_after=episodes if finite else None,
                  on_stop_after=scheduler.stop)
    freeze_long_lived()  # as the coordinator does once its parts are built, with its GC schedule
    gc_schedule = GcSchedule(args.gc_full_interval_s)
    gc_schedule.start()
    meter = ProcessMeter({"coordinator": os.getpid(), "sim_inference": sim.pid, "sandbox_host": host.pids})
    lag = LagSampler()
    lag.start()
    gc_pauses = GcPauses()
    gc_pauses.start()
    acker = asyncio.create_task(ack_everything(spool))
    rss_base = meter.rss("coordinator")
    t_start = time.monotonic()
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(scheduler.run(itertools.repeat(task), None, run.attempt))
            last_log = t_start
            while gate is not None and len(live.started | live.finished) < episodes:
                await asyncio.sleep(0.2)
                if time.monotonic() - last_log > 15:
                    last_log = time.monotonic()
                    log.warning("ramp-up: %d of %d episodes have a provisioned sandbox", len(live.started), episodes)
            ramp_s = time.monotonic() - t_start
            # Every episode holds its sandbox, shell and opening prompt and has not generated yet:
            # the growth since the start is the per-episode cost without trajectory arrays.
            rss_ramp, live_ramp = meter.rss("coordinator"), len(live.started - live.finished)
            if gate is not None:
                gate.set()
            await asyncio.sleep(args.warmup_s)
            live_at_start = live.live
            log.warning("window: %d live episodes, measuring for %.0f s", live_at_start, args.window_s)
            cpu0 = await asyncio.to_thread(meter.cpu, True)
            # Our own CPU is read here and before the end scan: scanning thousands of shell processes
            # with psutil takes seconds of this process's CPU and must not count as coordinator work. The
            # turns are counted from here too: those done during the scan (its CPU not counted) are not ours.
            clock.reset_samples()
            cpu0["coordinator"] = time.process_time()
            packing0 = pool.stream_stats()
            deltas0 = prompt_delta_counts(pool)
            journal0 = journal_counts(journal)
            w0 = time.monotonic()
            lag.recording = gc_pauses.recording = True
            deadline = float("inf") if finite else w0 + args.window_s
            timeline: list[dict[str, float]] = []
            mark = (w0, 0, time.process_time(), os.times().system)
            while time.monotonic() < deadline and not (finite and scheduler.stopping and not scheduler.running):
                await asyncio.sleep(0.1)
                if time.monotonic() - mark[0] >= args.timeline_s:
                    mark = timeline_point(timeline, mark, w0, clock.generations, live.turn_of)
            lag.recording = gc_pauses.recording = False
            window = time.monotonic() - w0
            turns = clock.generations
            packing = {k: v if k.startswith("most_") else v - packing0.get(k, 0)  # a maximum: over the whole run
                       for k, v in pool.stream_stats().items()}
            deltas = {k: v - deltas0[k] for k, v in prompt_delta_counts(pool).items()}
            journal_window = {k: v - journal0[k] for k, v in journal_counts(journal).items()}
            live_at_end = live.live
            rss_end = meter.rss("coordinator")
            # A journaled episode keeps no trajectory arrays: nothing to subtract from its RSS.
            live_traj_bytes = 0 if journal is not None else live.trajectory_bytes(routing_bytes_per_token(args))
            own_cpu = time.process_time()
            cpu1 = await asyncio.to_thread(meter.cpu, True)
            cpu1["coordinator"] = own_cpu
            census = gc_census()  # after the window: walking every object takes a while
            t_stop = time.monotonic()
            stop.set()
            scheduler.stop()
            await scheduler.drain(STOP_WAIT_S)  # every episode ends on `stop`; the bound only keeps a hang finite
        stop_s = time.monotonic() - t_stop
    finally:
        stop.set()
        scheduler.stop()
        await lag.stop()
        gc_pauses.stop()
        gc_schedule.stop()
        acker.cancel()
        await pool.close()
        await sandboxes.close()
        await host.close()
        spool.close()
        if journal is not None:
            journal.close()
        sim.terminate()
        await sim.wait()
    out = scale_result(
        episodes=episodes, live_at_start=live_at_start, live_at_end=live_at_end, ramp_s=ramp_s, window_s=window,
        turns=turns, cpu0=cpu0, cpu1=cpu1, clock=clock, lag_s=lag.samples, rss_base=rss_base, rss_end=rss_end,
        live_traj_bytes=live_traj_bytes, spooled=run.spooled(), stop_s=stop_s, errors=run.errors,
        raw_bytes_per_token=4 + 4 + routing_bytes_per_token(args))
    out["rss_mb"]["ramp_end"] = round(rss_ramp / 2**20, 1)
    out["rss_per_episode_at_ramp_end_kb"] = (
        round((rss_ramp - rss_base) / live_ramp / 1024, 1) if gate is not None and live_ramp else None)
    if out["rss_per_episode_at_ramp_end_kb"] is not None:  # the clean figure: no trajectory arrays yet
        out["targets"]["rss_per_live_episode_under_200kb"] = out["rss_per_episode_at_ramp_end_kb"] < 200
    out["journal"] = None if journal is None else {
        **journal_window, "bytes_per_turn": round(journal_window["bytes"] / max(turns, 1), 1),
        "frames_per_turn": round(journal_window["frames"] / max(turns, 1), 3),
        "fsyncs_per_turn": round(journal_window["syncs"] / max(turns, 1), 5),
        "fsync_window_ms": args.journal_fsync_ms, "write_errors": journal.write_errors}
    out["gc_pauses"] = gc_pauses.summary()
    out["late_wakeups"] = lag.late_wakeups()
    out["gc_census_at_window_end"] = census
    out["generate_packing"] = {
        "requests_per_message": round(packing["requests_sent"] / max(packing["messages_sent"], 1), 2),
        "results_per_message": round(packing["results_received"] / max(packing["messages_received"], 1), 2),
        **packing} if packing else None
    out["prompt_deltas"] = {**deltas, "share_of_requests": round(deltas["sent"] / max(turns, 1), 3)}
    out["episode_statuses"] = dict(run.statuses)
    out["timeline"] = timeline
    out["episodes_launched"] = run.launched
    return out


def journal_counts(journal: Any) -> dict[str, int]:
    """Frames, bytes and syncs the journal has written so far (zeros without one)."""
    if journal is None:
        return {"frames": 0, "bytes": 0, "syncs": 0}
    return {"frames": journal.frames, "bytes": journal.bytes, "syncs": journal.syncs}


def prompt_delta_counts(pool: Any) -> dict[str, float]:
    """Requests the pool sent as prompt deltas, and deltas it had to resend whole, so far."""
    sample = pool.metrics.registry.get_sample_value
    return {"sent": sample("t1_inference_prompt_deltas_total") or 0.0,
            "resent_whole": sample("t1_inference_prompt_resends_total") or 0.0}


def timeline_point(timeline: list[dict[str, float]], mark: tuple[float, int, float, float], w0: float,
                   generations: int, turn_of: dict[str, int]) -> tuple[float, int, float, float]:
    """Append CPU per turn of this process since `mark` (and its kernel part), and how deep the live
    episodes are; returns the new mark."""
    now, cpu, sys_cpu = time.monotonic(), time.process_time(), os.times().system
    turns = generations - mark[1]
    timeline.append({"t_s": round(now - w0, 1), "turns": turns, "turns_per_s": round(turns / (now - mark[0]), 1),
                     "coordinator_cpu_ms_per_turn": round((cpu - mark[2]) * 1e3 / max(turns, 1), 3),
                     "coordinator_kernel_ms_per_turn": round((sys_cpu - mark[3]) * 1e3 / max(turns, 1), 3),
                     "mean_turn_index": round(sum(turn_of.values()) / max(len(turn_of), 1), 1)})
    return now, generations, cpu, sys_cpu


def routing_bytes_per_token(args: argparse.Namespace) -> int:
    return args.layers * args.top_k * (1 if args.experts <= 256 else 2)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    ensure_model(args.model)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("out",)}
    out: dict[str, Any] = {"benchmark": "load", "machine": machine(), "path": PATH, "settings": settings,
                           "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "scales": []}
    for n in args.scale_list:
        check_host_limits(n, bubblewrap=not args.no_bubblewrap, hosts=args.sandbox_hosts)
        with tempfile.TemporaryDirectory(prefix=f"t1-load-{n}-") as tmp:
            log.warning("scale %d: starting", n)
            out["scales"].append(await run_scale(args, n, Path(tmp)))
            print_table(out["scales"][-1:], title=f"load: {n} concurrent episodes")
    return out


TASKS_PER_SANDBOX = {True: 6, False: 3}
"""Host tasks one idle sandbox with its shell holds: with bubblewrap its outer bubblewrap, the bash
that is its PID 1, nsenter, and the shell's supervisor, subshell and worker; without, the last three."""
FDS_PER_SANDBOX = 4  # in the sandbox host: an SSH socket and the session's three pipes


FDS_PER_EPISODE = 1  # in the coordinator: the sandbox's SSH connection (the journal holds no descriptor)
FDS_SPARE = 1000


def sandbox_hosts(episodes: int, asked: int = 0) -> int:
    """How many sandbox host processes hold `episodes` sandboxes: `asked`, or as few as the open-files
    limit of one process allows."""
    import resource

    if asked:
        return asked
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1
    return max(1, math.ceil(episodes * FDS_PER_SANDBOX / max(1, soft - FDS_SPARE)))


def check_host_limits(episodes: int, bubblewrap: bool, hosts: int = 0) -> None:
    """Fail before starting when this host cannot hold `episodes` sandboxes: pids and open files."""
    import resource

    tasks = episodes * TASKS_PER_SANDBOX[bubblewrap] + 2000  # the rest of the machine
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    with open("/proc/sys/kernel/threads-max") as f:
        threads_max = int(f.read())
    per_host = math.ceil(episodes / sandbox_hosts(episodes, hosts)) * FDS_PER_SANDBOX + FDS_SPARE
    coordinator = episodes * FDS_PER_EPISODE + FDS_SPARE
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    problems = []
    if tasks > min(pid_max, threads_max):
        problems.append(f"kernel.pid_max / kernel.threads-max is {min(pid_max, threads_max)}; {episodes} sandboxes "
                        f"need about {tasks} tasks")
    if soft != resource.RLIM_INFINITY and max(per_host, coordinator) > soft:
        problems.append(f"the open-files limit (ulimit -n) is {soft}; each sandbox host needs about {per_host} "
                        f"(--sandbox-hosts spreads them) and the coordinator about {coordinator}")
    if problems:
        raise SystemExit(f"load.py: this host cannot run {episodes} episodes: " + "; ".join(problems))


def strict_json(value: Any) -> Any:
    """NaN (a figure that could not be measured, e.g. RSS with no live episode) becomes null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict_json(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    if len(args.scale_list) > 1:
        return run_scales_apart(args, list(sys.argv[1:] if argv is None else argv))
    return main_from_args(args)


def run_scales_apart(args: argparse.Namespace, argv: list[str]) -> int:
    """Each scale in a fresh process, so one scale's memory and sockets do not bias the next."""
    own = [a for i, a in enumerate(argv) if not _is_flag_or_value(argv, i, ("--scales", "--out"))]
    out: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="t1-load-scales-") as tmp:
        for n in args.scale_list:
            part = Path(tmp) / f"{n}.json"
            code = subprocess.call(peer_command([sys.executable, str(Path(__file__).resolve()), *own,
                                                 "--scales", str(n), "--out", str(part)]))
            if code != 0:
                log.error("scale %d failed (exit %d)", n, code)
                return code
            result = json.loads(part.read_text())
            if out is None:
                out = result
                out["settings"]["scales"] = args.scales
            else:
                out["scales"].extend(result["scales"])
    assert out is not None
    print_table(out["scales"], title="load: all scales")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2, allow_nan=False) + "\n")
    return 0


def _is_flag_or_value(argv: list[str], i: int, flags: tuple[str, ...]) -> bool:
    """True for `--flag`, `--flag=v`, and the value after a bare `--flag`, for any of `flags`."""
    a = argv[i]
    if a in flags or any(a.startswith(f + "=") for f in flags):
        return True
    return i > 0 and argv[i - 1] in flags


def main_from_args(args: argparse.Namespace) -> int:
    # Every stopped episode logs its (deliberate) generate failure; keep the output readable.
    logging.getLogger("t1.agent.episode").setLevel(logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from t1.rpc.loop import run

    out = run(main_async(args))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(strict_json(out), indent=2, allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
