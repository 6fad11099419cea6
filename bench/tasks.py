"""Task throughput on local sandboxes: oracle-plus-verify tasks per minute, and where a task's time goes.

Run: .venv/bin/python bench/tasks.py [--n 20] [--concurrency 1,2] [--out FILE]

Synthesizes a stratified corpus (every family), then for each concurrency runs every task twice in
fresh local sandboxes (bubblewrap behind the embedded SSH server): once in oracle mode (reference
solution, then verifiers) and once in verify mode (verifiers on an untouched sandbox). It reports
tasks per minute (one task = its oracle run plus its verify run), the median wall time per run,
and, per family, the median oracle run time. Every oracle must resolve and no verify run may.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine_info import machine
from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.local.local_provider import LocalProvider
from t1.tasks.formats.dataset import load_dataset
from t1.tasks.spec import TaskSpec
from t1.tasks.synth import synthesize
from t1.tasks.verify.oracle import RunMode, TaskRun, run_task


async def _timed(
    provider: LocalProvider, spec: TaskSpec, mode: RunMode, gate: asyncio.Semaphore
) -> tuple[TaskRun, float]:
    async with gate:
        start = time.perf_counter()
        run = await run_task(provider, spec, mode)
        return run, time.perf_counter() - start


async def bench(specs: list[TaskSpec], concurrency: int, root: Path) -> dict[str, Any]:
    provider = LocalProvider(LocalProviderConfig(root=root), ShellConfig())
    gate = asyncio.Semaphore(concurrency)
    try:
        start = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            jobs = [(spec, mode, tg.create_task(_timed(provider, spec, mode, gate)))
                    for spec in specs for mode in (RunMode.ORACLE, RunMode.VERIFY)]
        wall = time.perf_counter() - start
    finally:
        await provider.close()
    per_family: dict[str, list[float]] = defaultdict(list)
    oracle_s, verify_s, bad = [], [], []
    for spec, mode, job in jobs:
        run, seconds = job.result()
        if mode is RunMode.ORACLE:
            oracle_s.append(seconds)
            per_family[spec.metadata.family].append(seconds)
            if not run.resolved:
                bad.append(f"oracle {run.task}: {run.status} {run.report.failure_mode}")
        else:
            verify_s.append(seconds)
            if run.resolved:
                bad.append(f"verify {run.task}: passes without work")
    return {"concurrency": concurrency, "tasks": len(specs), "wall_s": wall, "tasks_per_min": 60 * len(specs) / wall,
            "oracle_median_s": statistics.median(oracle_s), "verify_median_s": statistics.median(verify_s),
            "family_oracle_median_s": {f: statistics.median(v) for f, v in sorted(per_family.items())},
            "problems": bad}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="Synthesized tasks (stratified over families).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", default="1,2", help="Comma-separated concurrency levels.")
    parser.add_argument("--out", type=Path, default=None, help="Write the results as JSON here.")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="t1-bench-tasks-", dir="/tmp"))
    os.chmod(work, 0o711)
    try:
        synthesize(work / "corpus", n=args.n, seed=args.seed)
        specs = load_dataset([work / "corpus"])
        results = [asyncio.run(bench(specs, int(level), work / f"sandboxes-{level}"))
                   for level in args.concurrency.split(",")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'concurrency':>11} {'tasks':>6} {'wall s':>8} {'tasks/min':>10} {'oracle p50 s':>13} {'verify p50 s':>13}")
    for r in results:
        print(f"{r['concurrency']:>11} {r['tasks']:>6} {r['wall_s']:>8.1f} {r['tasks_per_min']:>10.1f} "
              f"{r['oracle_median_s']:>13.2f} {r['verify_median_s']:>13.2f}")
    base = results[0]["tasks_per_min"]
    for r in results[1:]:
        print(f"speed-up at concurrency {r['concurrency']} vs {results[0]['concurrency']}: "
              f"{r['tasks_per_min'] / base:.2f}x")
    print("oracle p50 s per "
          "family:", json.dumps({f: round(v, 2) for f, v in results[-1]["family_oracle_median_s"].items()}))
    for r in results:
        for p in r["problems"]:
            print(f"PROBLEM (concurrency {r['concurrency']}): {p}")
    if args.out:
        args.out.write_text(
            json.dumps({"machine": machine(), "n": args.n, "seed": args.seed, "results": results}, indent=2)
        )


if __name__ == "__main__":
    main()
