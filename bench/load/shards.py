"""Coordinator shards under load: N coordinator processes sharing a total load, against 1 at the same total.

    .venv/bin/python -m bench.load.shards --episodes 400 --coordinators 1,2 --window-s 30 --out FILE [bench.load flags]

For each N in --coordinators, N copies of the load run (`bench.load`, one process each: its own
Scheduler, RolloutRunner, InferencePool and Spool, as a coordinator shard has) start together with
--episodes / N concurrent episodes each and measure over the same window length. The totals are
side by side: turns/s (summed), coordinator CPU per turn (all shards' CPU over all their turns),
the worst shard's event-loop lag p99, and each shard's figures. Every copy has its own simulated
inference server and sandbox host (bench.sim_inference, bench.sandbox_host): the shards share no
state in T1 either (the trainer stand-in is each copy's acking cursor), so what is compared is the
coordinators' own cost, not a shared fleet's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rich.console import Console
from rich.table import Table

from bench.machine_info import machine
from bench.sandbox_host import peer_command

REPO_ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=400, help="total concurrent episodes, split over the shards")
    p.add_argument("--coordinators", default="1,2", help="comma-separated shard counts to compare")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args, rest = p.parse_known_args(argv)
    args.counts = [int(c) for c in args.coordinators.split(",") if c.strip()]
    if not args.counts or min(args.counts) < 1 or any(args.episodes % n for n in args.counts):
        p.error(f"--coordinators {args.coordinators!r} must be positive and divide --episodes {args.episodes}")
    if any(a == "--scales" or a.startswith("--scales=") for a in rest):
        p.error("--scales is set from --episodes / N")
    return args, rest


def run_shards(n: int, episodes: int, rest: list[str], tmp: Path) -> list[dict[str, Any]]:
    """N load runs at once, `episodes / n` each; their per-scale results."""
    parts = [tmp / f"n{n}-shard{i}.json" for i in range(n)]
    procs = [subprocess.Popen(peer_command([sys.executable, "-m", "bench.load", *rest, "--scales",
                                            str(episodes // n), "--out", str(part)]), cwd=REPO_ROOT)
             for part in parts]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"bench.load.shards: a shard of {n} failed (exit codes {codes})")
    return [json.loads(part.read_text())["scales"][0] for part in parts]


def combine(n: int, shards: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over the shards of one run (pure)."""
    turns = sum(s["turns"] for s in shards)
    cpu = {name: sum(s["cpu_ms_per_turn"][name] * s["turns"] for s in shards) / max(turns, 1)
           for name in shards[0]["cpu_ms_per_turn"]}
    return {"coordinators": n, "episodes": sum(s["episodes"] for s in shards),
            "turns_per_s": round(sum(s["turns_per_s"] for s in shards), 2),
            "coordinator_cpu_ms_per_turn": round(cpu["coordinator"], 3),
            "cpu_ms_per_turn": {k: round(v, 3) for k, v in cpu.items()},
            "coordinator_cores": round(sum(s["cpu_cores_used"].get("coordinator", 0.0) for s in shards), 3),
            "loop_lag_p99_ms_worst": max(s["loop_lag_ms"].get("p99", 0.0) for s in shards),
            "num_errors": sum(s["num_errors"] for s in shards), "shards": shards}


def print_side_by_side(runs: list[dict[str, Any]]) -> None:
    table = Table(title="coordinator shards at the same total load")
    table.add_column("figure")
    for r in runs:
        table.add_column(f"{r['coordinators']} coordinator(s)", justify="right")
    rows = [("episodes (total)", "episodes"), ("turns/s (sum)", "turns_per_s"),
            ("coordinator CPU per turn, ms", "coordinator_cpu_ms_per_turn"),
            ("coordinator cores used (sum)", "coordinator_cores"), ("loop lag p99, worst shard, ms",
                                                                    "loop_lag_p99_ms_worst"),
            ("errors", "num_errors")]
    for label, key in rows:
        table.add_row(label, *(str(r[key]) for r in runs))
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    args, rest = parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="t1-load-shards-") as tmp:
        for n in args.counts:
            runs.append(combine(n, run_shards(n, args.episodes, rest, Path(tmp))))
    print_side_by_side(runs)
    if args.out:
        out = {"benchmark": "load_shards", "machine": machine(), "settings": {"episodes": args.episodes,
               "coordinators": args.counts, "load_flags": rest},
               "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2, allow_nan=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
