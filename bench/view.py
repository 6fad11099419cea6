"""`t1 view` on a large run: page latency over real HTTP against a generated run directory.

    python bench/view.py --episodes 10000 --out bench/results/view_cpu_10000.json [--dir DIR --keep]

The run directory is written by T1's own writers (trainer buffer, spool, run log, eval-job store,
transcripts), so the viewer reads exactly what a run leaves: `--episodes` training trajectories in
groups of `--group-size` (the last `--spool-share` of them still in the spool, as in a live run),
one transcript each, a status record every 5 s of simulated time, one committed trainer step per
`--groups-per-step` groups and two eval jobs. Then `t1 view DIR --port 0` starts as its own
process, and each page is fetched `--reps` times over one keep-alive connection; the table prints
the median and p90 of each page and the time the viewer took to index the directory.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is not on the path

from bench.machine_info import cpu_name
from t1.agent.transcript import Transcript
from t1.coordinator.evals.job_store import JobState, JobStore
from t1.coordinator.spool.trajectory_spool import Spool
from t1.evals.results import AttemptOutcome
from t1.metrics.runlog import RunLog
from t1.trainer.buffer import StepRecord, TrajectoryBuffer
from t1.trajectory.serialization import encode_trajectory
from t1.trajectory.types import EpisodeStatus, Segment, Trajectory, TurnSpan, VerifierSummary

LONG_ID = "sqlite-train-1000-long-a0"
FAMILIES = ("sqlite", "process_service", "git_repair", "log_parse", "http_config")


def make_trajectory(rng: np.random.Generator, tid: str, task: str, group: str, attempt: int, version: int,
                    tokens: int, turns: int, layers: int, top_k: int) -> Trajectory:
    mask = np.zeros(tokens, bool)
    spans = []
    step = tokens // (turns + 1)
    for t in range(turns):
        start = step * (t + 1) - step // 3
        mask[start:start + step // 3] = True
        spans.append(TurnSpan(start, start + step // 3, float(rng.random() < 0.2)))
    routing = rng.integers(0, 64, (tokens, layers, top_k)).astype(np.uint8)
    seg = Segment(rng.integers(9, 30_000, tokens).astype(np.int32),
                  np.where(mask, -rng.random(tokens), np.nan).astype(np.float32), mask,
                  np.where(mask, version, -1).astype(np.int32), routing, tuple(spans))
    passed = int(rng.integers(0, 6))
    status = EpisodeStatus.INFRA_ERROR if rng.random() < 0.02 else EpisodeStatus.OK
    return Trajectory(tid, task, group, attempt, (seg,), float(passed), status,
                      VerifierSummary(passed, 5, tuple((f"test_{i}", "passed" if i < passed else "failed")
                                                       for i in range(5))))


def make_run_dir(root: Path, episodes: int, group_size: int, groups_per_step: int, spool_share: float,
                 tokens: int, turns: int, layers: int, top_k: int, long_tokens: int = 0,
                 seed: int = 0) -> dict[str, float]:
    """Write a run directory of `episodes` trajectories with T1's writers; returns how long each part took."""
    rng = np.random.default_rng(seed)
    run, trainer = root / "run", root / "trainer"
    t0 = time.perf_counter()
    buffer = TrajectoryBuffer(trainer / "buffer.sqlite")
    buffer._db.execute("PRAGMA synchronous=OFF")  # throwaway data: one fsync per row would dominate the set-up
    runlog = RunLog(run / "run.jsonl")
    runlog.write("start", name="bench-view", address="127.0.0.1:0")
    in_spool = int(episodes * spool_share)
    spooled: list[Trajectory] = []
    num_groups = -(-episodes // group_size)
    step, version, made = 0, 0, 0
    pending: list[str] = []
    for g in range(num_groups):
        task = f"{FAMILIES[g % len(FAMILIES)]}-train-{1000 + g // 3}"
        group = f"{task}-{g:06x}"
        for a in range(group_size):
            if made == episodes:
                break
            t = make_trajectory(rng, f"{group}-a{a}", task, group, a, version, tokens, turns, layers, top_k)
            if made >= episodes - in_spool:
                spooled.append(t)
            else:
                buffer.add(t.id, group, encode_trajectory(t))
                pending.append(t.id)
            tr = Transcript(run / "transcripts" / "train", task, t.id)
            tr.header(task, t.id, "tool_calls", f"Task {task}.", 900)
            for k in range(turns):
                tr.turn(k, '<tool_call>{"name": "bash"}</tool_call>', 40, 900 + 100 * k, version, "stop")
                tr.command(f"ls /app/{k}", "a\nb\n", 0, 0.1, False)
            tr.footer(str(t.status), t.reward, turns, tokens, 3.0, {})
            tr.close()
            made += 1
        if (g + 1) % groups_per_step == 0 and pending:
            step += 1
            version += 1
            metrics = {"kl": float(rng.random() * 0.01), "entropy": 4.0 - step * 1e-3, "clip_fraction": 0.1,
                       "explained_variance": 0.5, "t1_train_infer_logprob_abs_diff": 0.02, "policy_lag": 1.0}
            buffer.commit_steps([StepRecord(step, "ppo", version, tuple(pending), metrics)], {"step": step})
            runlog.write("trainer", step=step, stage="TRAINER_STAGE_PPO", version=version, metrics=metrics)
            runlog.write("weights", version=version, path=str(trainer / "weights" / f"v{version}"))
            pending = []
        if g % 4 == 0:
            runlog.write("status", stage="training", active=64, finished=made, turns_per_s=float(rng.random() * 20),
                         spool_pending=0, version=version, trainer_step=step, infra_failure_rate=0.02)
    buffer.close()
    written = time.perf_counter() - t0

    if long_tokens:
        # one long episode as production makes them: 48 layers x top-8 routing on every position
        spooled.append(make_trajectory(rng, LONG_ID, "sqlite-train-1000", "long", 0, version, long_tokens,
                                       max(turns, long_tokens // 256), 48, 8))

    async def spool_them() -> None:
        spool = Spool.open(run / "spool", 1 << 40, 64 << 20, fsync=False)
        for t in spooled:
            await spool.append(t.id, encode_trajectory(t))
        spool.close()

    asyncio.run(spool_them())
    store = JobStore(run / "jobs.db")
    for label in ("base", "rl"):
        job = store.create_job(f"{label}:heldout", b"", [f"sqlite-eval-{i}" for i in range(50)], 2)
        for i in range(50):
            for a in range(2):
                store.record_attempt(job.job_id, AttemptOutcome(
                    task_id=f"sqlite-eval-{i}", attempt=a, reward=float(rng.integers(0, 3)), passed=1, total=2,
                    status=EpisodeStatus.OK, turns=turns, tokens=tokens, resolved=bool(rng.random() < 0.3)))
        store.set_state(job.job_id, JobState.SUCCEEDED)
    store.close()
    runlog.write("stop", spool_pending=len(spooled))
    runlog.close()
    return {"write_s": written, "total_s": time.perf_counter() - t0}


def fetch(conn: http.client.HTTPConnection, path: str) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    return time.perf_counter() - t0, resp.status, len(body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=10_000)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--groups-per-step", type=int, default=4)
    p.add_argument("--spool-share", type=float, default=0.05, help="share of episodes still in the spool")
    p.add_argument("--tokens", type=int, default=1024, help="tokens per episode")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--layers", type=int, default=4, help="routing layers recorded per token")
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--long-tokens", type=int, default=32768,
                   help="also spool one episode this long, with 48x8 routing (0: none)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--dir", type=Path, default=None, help="generate here (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the generated run directory")
    p.add_argument("--out", type=Path, default=None, help="write the JSON result here")
    args = p.parse_args(argv)

    root = args.dir or Path(tempfile.mkdtemp(prefix="t1-bench-view-"))
    load_before = round(os.getloadavg()[0], 2)  # the machine is shared: say how busy it was
    try:
        if not (root / "run" / "run.jsonl").is_file():
            made = make_run_dir(root, args.episodes, args.group_size, args.groups_per_step, args.spool_share,
                                args.tokens, args.turns, args.layers, args.top_k, args.long_tokens)
            print(f"generated {args.episodes} episodes in {made['total_s']:.1f}s at {root}", flush=True)
        result = measure(root / "run", args.reps, args.long_tokens)
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    result["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"}
    result["machine"] = {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                         "platform": platform.platform(),
                         "loadavg_1m_before_after": [load_before, round(os.getloadavg()[0], 2)]}
    print(f"\nt1 view on {result['episodes']} episodes: indexed in {result['index_s']:.2f}s "
          f"({result['rss_mb']:.0f} MB resident)")
    print(f"{'page':<44} {'median ms':>10} {'p90 ms':>8} {'KB':>8}")
    for name, row in result["pages"].items():
        print(f"{name:<44} {row['median_ms']:>10.1f} {row['p90_ms']:>8.1f} {row['kb']:>8.0f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def measure(run_dir: Path, reps: int, long_tokens: int) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "t1.cli.main", "view", str(run_dir), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"(\d+) episodes .* http://127\.0\.0\.1:(\d+)/", line)
        if not m:
            raise SystemExit(f"t1 view did not start: {line}{proc.stdout.read()}")
        index_s = time.perf_counter() - t0
        conn = http.client.HTTPConnection("127.0.0.1", int(m.group(2)), timeout=60)
        first = fetch(conn, "/episodes?sort=reward&page=3")
        conn.request("GET", "/episodes?family=sqlite&source=train")
        html = conn.getresponse().read().decode()
        episodes = [e for e in re.findall(r'href="/episodes/([^"?]+)"', html) if e != LONG_ID]
        groups = [g for g in re.findall(r'href="/groups/([^"?]+)"', html) if g != "long"]
        assert episodes and groups, "the episodes page lists no episode"
        pages = {
            "/episodes (newest first)": "/episodes",
            "/episodes?sort=reward&order=asc&page=100": "/episodes?sort=reward&order=asc&page=100",
            "/episodes?family=sqlite&min_reward=2&sort=tokens": "/episodes?family=sqlite&min_reward=2&sort=tokens",
            "/ (run: curves, stages, evals)": "/",
            "/episodes/<id> (turns + token view)": f"/episodes/{episodes[0]}",
            "/groups/<id>": f"/groups/{groups[0]}",
        }
        if long_tokens:
            pages[f"/episodes/<id> ({long_tokens}-token episode)"] = f"/episodes/{LONG_ID}"
        rows = {}
        for name, path in pages.items():
            times, size = [], 0
            for _ in range(reps if "token episode" not in name else max(3, reps // 5)):
                dt, status, size = fetch(conn, path)
                if status != 200:
                    raise SystemExit(f"{path}: HTTP {status}")
                times.append(dt * 1000)
            times.sort()
            rows[name] = {"path": path, "median_ms": statistics.median(times),
                          "p90_ms": times[int(0.9 * (len(times) - 1))], "kb": size / 1024, "reps": len(times)}
        rss = _rss_mb(proc.pid)
        return {"episodes": int(m.group(1)), "index_s": index_s, "first_page_ms": first[0] * 1000,
                "rss_mb": rss, "pages": rows}
    finally:
        proc.terminate()
        proc.wait(10)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


if __name__ == "__main__":
    sys.exit(main())
