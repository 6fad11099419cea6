"""What one verification costs in a local sandbox: CPU of T1's process and of the sandbox's processes, and wall time.

    python -m bench.verifier_cost --out bench/results/verifier_cost_cpu.json [--runs 40 --rounds 3]

A cheap verifier like the learning curriculum's (a bash tests/test.sh writing reward.json with two checks) is
verified `--runs` times in one sandbox, as an episode's per-turn verifications are: a verifier shell opened,
`run_verifier`, the shell closed. Two ways of moving the tests in and the results out alternate over `--rounds`:
`inline` (the shipped way: files of at most INLINE_MAX_BYTES through the shell itself) and `file_transfer`
(every file through Shell.write_file / read_file, an SFTP session per verifier shell, as before). CPU is
getrusage of this process (the SSH client and the embedded server) and of its reaped children (the sandbox's
processes, counted once each verifier shell has ended); medians per verification over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
R=""
check() { local name=$1; shift; if ( "$@" ) >/dev/null 2>&1; then v=1; else v=0; fi; R="$R${R:+, }\\"$name\\": $v"; }
check target_exists test -f /app/gold.txt
check count_written grep -qx 2 /app/gold.txt
echo "{$R}" > /logs/verifier/reward.json
"""
MODES = ("inline", "file_transfer")


def _task(root: Path) -> Path:
    d = root / "task"
    (d / "tests").mkdir(parents=True)
    (d / "task.toml").write_text('[verifier]\ntimeout_sec = 30\n[agent]\ntimeout_sec = 60\n')
    (d / "instruction.md").write_text("Write 2 into /app/gold.txt.\n")
    (d / "tests" / "test.sh").write_text(TEST_SH)
    return d


async def _read_by_transfer(shell: Any, path: str) -> bytes | None:
    """How results were read before: the path's kind in one command, then the file transferred."""
    from t1.tasks.transfer import path_kind

    return await shell.read_file(path) if await path_kind(shell, path) == "file" else None


def _cpu() -> tuple[float, float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime, time.perf_counter()


async def _round(sandbox: Any, spec: Any, provisioned: Any, runs: int, mode: str, shipped: int) -> dict[str, float]:
    from t1.sandbox.types import ShellRole
    from t1.tasks import transfer
    from t1.tasks.verify import verifier
    from t1.tasks.verify.verifier import run_verifier

    inline = mode == "inline"
    transfer.INLINE_MAX_BYTES = shipped if inline else -1  # -1: no archive fits, every upload is a file transfer
    verifier.read_if_exists = transfer.read_if_exists if inline else _read_by_transfer  # type: ignore[assignment]
    before = _cpu()
    for _ in range(runs):
        shell = await sandbox.open_shell(role=ShellRole.VERIFIER)
        report = await run_verifier(shell, spec.phases()[0].verifier, provisioned, offline=True)
        await shell.close()
        assert report.total == 2, report
    await asyncio.sleep(0.2)  # the last shells' processes are reaped
    after = _cpu()
    return {"own_ms": (after[0] - before[0]) / runs * 1e3, "sandbox_ms": (after[1] - before[1]) / runs * 1e3,
            "wall_ms": (after[2] - before[2]) / runs * 1e3}


async def measure(runs: int, rounds: int) -> dict[str, Any]:
    from t1.config.sandbox import LocalProviderConfig, ShellConfig
    from t1.sandbox.local.local_provider import LocalProvider
    from t1.tasks.formats.dataset import load_task
    from t1.tasks.provision import provision, sandbox_request
    from t1.tasks.transfer import INLINE_MAX_BYTES

    work = Path(tempfile.mkdtemp(prefix="t1-verifier-cost-", dir="/tmp"))
    os.chmod(work, 0o711)
    provider = LocalProvider(LocalProviderConfig(root=work / "sandboxes"), ShellConfig(command_timeout_s=120.0))
    spec = load_task(_task(work))
    samples: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    try:
        sandbox = await provider.create(sandbox_request(spec))
        shell = await sandbox.open_shell()
        provisioned = await provision(shell, spec, provider.traits)
        await sandbox.end_setup()
        await _round(
            sandbox, spec, provisioned, 3, "inline", INLINE_MAX_BYTES
        )  # warm: the first shells pay one-time costs
        for _ in range(rounds):
            for mode in MODES:
                samples[mode].append(await _round(sandbox, spec, provisioned, runs, mode, INLINE_MAX_BYTES))
        await shell.close()
        await provider.destroy(sandbox)
    finally:
        await provider.close()
    rows = {m: {k: statistics.median(s[k] for s in samples[m]) for k in ("own_ms", "sandbox_ms", "wall_ms")}
            for m in MODES}
    for row in rows.values():
        row["cpu_ms"] = row["own_ms"] + row["sandbox_ms"]
    return {"rows": rows, "samples": samples,
            "cpu_ratio_inline_over_file_transfer": rows["inline"]["cpu_ms"] / rows["file_transfer"]["cpu_ms"]}


def main() -> None:
    from bench.machine_info import describe, machine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="write the JSON result here")
    p.add_argument("--runs", type=int, default=40, help="verifications per round and mode")
    p.add_argument("--rounds", type=int, default=3, help="rounds, the two modes alternating")
    args = p.parse_args()
    result = {"machine": machine(), "settings": {"runs": args.runs, "rounds": args.rounds},
              "load_avg_1m_before": os.getloadavg()[0], **asyncio.run(measure(args.runs, args.rounds))}
    print(describe(result["machine"]) + f": {args.runs} verifications x {args.rounds} rounds per mode (medians)")
    print(f"{'mode':<14}{'own CPU ms':>12}{'sandbox CPU ms':>16}{'CPU ms':>10}{'wall ms':>10}")
    for mode, row in result["rows"].items():
        print(f"{mode:<14}{row['own_ms']:>12.1f}{row['sandbox_ms']:>16.1f}{row['cpu_ms']:>10.1f}{row['wall_ms']:>10.1f}")
    print(f"CPU per verification, inline / file transfer: {result['cpu_ratio_inline_over_file_transfer']:.2f}")
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
