"""Coordinator teardown: one bound over the whole of Parts.close, also when a sandbox destroy never returns."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

from t1.config.loader import load_config
from t1.coordinator.run.parts import Parts
from t1.coordinator.run.run_state import RunPhase, RunState
from t1.sandbox.types import Sandbox


async def test_shutdown_whose_sandbox_destroy_hangs_ends_within_the_bound(tmp_path: Path, tiny_model_dir: Path,
                                                                          monkeypatch) -> None:
    sandboxes = Path(tempfile.mkdtemp(prefix="t1-shutdown-test-"))
    sandboxes.chmod(0o711)
    run_dir = tmp_path / "run"
    cfg = load_config(None, [f"inference.model.path={tiny_model_dir}", f"coordinator.run_dir={run_dir}",
                             "coordinator.server.port=0", "metrics.port=null", f"sandbox.local.root={sandboxes}",
                             "rollout.transcripts=false"])
    state = RunState()
    parts = await Parts.build(cfg, run_dir, [], state)
    await parts.start_services()
    assert parts.run_status().stage == RunPhase.STARTING.value
    state.phase = RunPhase.SERVING
    assert parts.run_status().stage == "serving"

    held = asyncio.Event()

    async def episode() -> None:
        async with parts.sandboxes.acquire() as sandbox:
            assert (await sandbox.exec("echo up")).exit_status == 0
            held.set()
            await asyncio.Event().wait()

    holder = asyncio.create_task(episode())
    await asyncio.wait_for(held.wait(), 60)
    release = asyncio.Event()
    real_destroy = parts.provider.destroy
    calls: list[str] = []

    async def hangs(sandbox: Sandbox) -> None:
        calls.append(sandbox.id)
        await release.wait()  # a provider whose destroy call never returns (until the test lets it)
        await real_destroy(sandbox)

    monkeypatch.setattr(parts.provider, "destroy", hangs)
    try:
        bound_s = 2.0
        t0 = time.monotonic()
        await asyncio.wait_for(parts.close(bound_s), bound_s + 10)  # the outer timeout only keeps a failure short
        elapsed = time.monotonic() - t0
        assert elapsed < bound_s + 1.0, elapsed
        assert calls, "the pool never tried to destroy the sandbox still out"
        assert parts.sandboxes.stats.destroy_failures >= 1
        assert parts.spool.closed
        records = [json.loads(line) for line in (run_dir / "run.jsonl").read_text().splitlines()]
        assert records[-1]["event"] == "stop"
    finally:  # let the destroys finish, then really close the provider (its SSH server)
        release.set()
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
        monkeypatch.setattr(parts.provider, "destroy", real_destroy)
        await parts.provider.close()
        shutil.rmtree(sandboxes, ignore_errors=True)
