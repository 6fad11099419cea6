"""A stand-in coordinator for the sandbox service tests: `python service_owner.py ROOT RUN_DIR GRACE_S OVERLAY`.

Builds the local provider a coordinator of RUN_DIR builds (its sandboxes in the run's sandbox
service), creates a sandbox, leaves a file and a detached process in it, creates another, and prints one JSON line
(the record, the process's pid, the service's and the holder's pids, the service's cgroup folders); then waits to be
killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxRequest

SPAWN = "setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $!"


async def main(root: Path, run_dir: Path, grace_s: float, overlay: bool) -> None:
    provider = LocalProvider(LocalProviderConfig(root=root, service_grace_s=grace_s, overlay=overlay), ShellConfig(),
                             run_dir)
    sandbox = await provider.create(SandboxRequest())
    await sandbox.end_setup()
    shell = await sandbox.open_shell()
    await shell.write_file("/app/kept.txt", b"before the crash\n")
    pid = (await shell.run(SPAWN)).output.strip()
    target = await provider.backend.target(sandbox.id)
    assert provider.service is not None and target is not None
    other = await provider.create(SandboxRequest())  # one the next coordinator does not reattach
    health = await provider.service.health()
    print(
        json.dumps(
            {
                "record": sandbox.record().to_json(),
                "other": other.id,
                "pid": pid,
                "service": provider.service.pid,
                "holder": target.pid,
                "cgroups": health["cgroups"],
            }
        ),
        flush=True,
    )
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "overlay"))
