"""The separate verifier streams the artifact pack: T1's memory is bounded by a constant, not the pack's size.

A real local sandbox whose attempt leaves 64 MiB of incompressible artifacts (a pack of 64 MiB); the oracle run
under tracemalloc: T1's Python allocations (the pack read whole was a bytes object of its size, and its upload
another) peak under a bound an eighth of the pack, and the verifier still gets every byte. A sandbox is made
first, outside the measure: the local provider's scan of the host (once per process, about 16 MiB) is not the
transfer's.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxRequest
from t1.tasks.formats.dataset import load_task
from t1.tasks.verify.oracle import RunMode, RunStatus, run_task

PACK_MB = 64
BOUND_MB = 8
TOML = """artifacts = ["/app/out"]
[environment]
allow_internet = false
[verifier]
environment_mode = "separate"
timeout_sec = 120
"""
SOLVE = f"""#!/bin/bash
mkdir -p /app/out && head -c {PACK_MB}M /dev/urandom > /app/out/data.bin
sha256sum /app/out/data.bin | cut -d' ' -f1 > /app/out/data.sha
"""
TEST = """ok=1
[ "$(stat -c %s /app/out/data.bin)" = "$((64 * 1024 * 1024))" ] || { ok=0; echo "data.bin has the wrong size"; }
[ "$(sha256sum /app/out/data.bin | cut -d' ' -f1)" = "$(cat /app/out/data.sha)" ] || { ok=0; echo "data.bin differs"; }
echo $ok > /logs/verifier/reward.txt
"""


async def test_the_artifact_pack_streams_through_bounded_memory(provider: LocalProvider, tmp_path: Path) -> None:
    root = tmp_path / "big-artifacts"
    (root / "tests").mkdir(parents=True)
    (root / "solution").mkdir()
    (root / "task.toml").write_text(TOML)
    (root / "instruction.md").write_text("Leave 64 MiB of data in /app/out.\n")
    (root / "tests" / "test.sh").write_text(TEST)
    (root / "solution" / "solve.sh").write_text(SOLVE)
    spec = load_task(root)
    await provider.destroy(await provider.create(SandboxRequest()))
    tracemalloc.start()
    try:
        run = await run_task(provider, spec, RunMode.ORACLE)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert run.status is RunStatus.OK and run.resolved, (run.as_json(), run.report.output_tail)
    assert peak < BOUND_MB << 20, f"peak {peak / (1 << 20):.1f} MiB of Python allocations for a {PACK_MB} MiB pack"
