"""What the copy-on-write root costs: sandbox start and per-command time, overlay vs read-only system.

`bench/shells.py --rootfs` runs this: two local providers in this process, one with
`overlay: true` and one with `overlay: false`, measured in alternating rounds (the machine is
noisy and shared, so only medians of the same run are compared). Per round and setting: `creates`
sandbox starts (create, the pool's health check, one framed shell: what an episode pays), then
`commands` framed round trips of each command in `COMMANDS` (a no-op, a lookup through the
overlay, and a write that copies a system file up into the sandbox's layer). Then, once per round
on the first sandbox, what the verifier pays: `end_setup` (with the overlay: snapshot of the upper
layer and the pristine overlay attached; a no-op without) and opening a verifier shell with one
command (with the overlay: its own root over the pristine system, `t1.sandbox.verifier.enter_verifier`).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.ssh.ssh_sandbox import SshSandbox
from t1.sandbox.types import Sandbox, SandboxRequest, ShellRole

SETTINGS = {"overlay": True, "readonly": False}
COMMANDS = {"true": "true", "lookup": "ls /usr/bin | wc -l",
            "copy_up": "n=$((n+1)); f=$(ls -d /usr/lib/x86_64-linux-gnu/*.so.* | sed -n ${n}p); touch -a $f "
                       "2>/dev/null; echo $?"}
"""copy_up touches a different system library each time, which copies it into the sandbox's layer;
without an overlay the touch fails at once (read-only system)."""


async def _start(provider: LocalProvider) -> tuple[float, Sandbox]:
    t = time.perf_counter()
    box = await provider.create(SandboxRequest())
    assert isinstance(box, SshSandbox)
    result = await box.exec("echo t1-ok")
    assert "t1-ok" in str(result.stdout), result
    await box.open_shell()
    return time.perf_counter() - t, box


async def _verifier(box: Sandbox) -> tuple[float, float]:
    """Seconds for `end_setup` and for a verifier shell's start plus one command."""
    t = time.perf_counter()
    await box.end_setup()
    sealed = time.perf_counter()
    shell = await box.open_shell(role=ShellRole.VERIFIER)
    assert (await shell.run("id -u")).output.strip() == "64999"
    opened = time.perf_counter()
    await shell.close()
    return sealed - t, opened - sealed


async def _commands(box: Sandbox, command: str, n: int) -> list[float]:
    shell = await box.open_shell()
    await shell.run(command)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        await shell.run(command)
        times.append(time.perf_counter() - t)
    await shell.close()
    return times


async def rootfs_section(rounds: int, creates: int, commands: int, shell_cfg: ShellConfig) -> dict[str, Any]:
    """Medians per setting over alternating rounds, and overlay / readonly ratios."""
    root = Path(tempfile.mkdtemp(prefix="t1-bench-rootfs-"))
    os.chmod(root, 0o711)
    providers = {name: LocalProvider(LocalProviderConfig(root=root / name, overlay=on), shell_cfg)
                 for name, on in SETTINGS.items()}
    samples: dict[str, dict[str, list[float]]] = {
        name: {"start": [], **{c: [] for c in COMMANDS}, "end_setup": [], "verifier_open": []} for name in SETTINGS
    }
    load_start = os.getloadavg()[0]
    try:
        for provider in providers.values():
            await provider.start()
        for _ in range(rounds):
            for name, provider in providers.items():
                boxes = []
                for _ in range(creates):
                    took, box = await _start(provider)
                    samples[name]["start"].append(took)
                    boxes.append(box)
                sealed, opened = await _verifier(boxes[0])
                samples[name]["end_setup"].append(sealed)
                samples[name]["verifier_open"].append(opened)
                for label, command in COMMANDS.items():
                    samples[name][label] += await _commands(boxes[0], command, commands)
                for box in boxes:
                    await provider.destroy(box)
    finally:
        for provider in providers.values():
            await provider.close()
    medians = {name: {key: round(1000 * statistics.median(values), 3) for key, values in by_key.items()}
               for name, by_key in samples.items()}
    ratios = {
        key: round(medians["overlay"][key] / max(medians["readonly"][key], 1e-3), 2) for key in medians["overlay"]
    }
    return {"ms_median": medians, "overlay_vs_readonly": ratios,
            "settings": {"rounds": rounds, "creates": creates, "commands": commands},
            "load_avg_1m": {"start": load_start, "end": os.getloadavg()[0]}}


def print_rootfs_table(section: dict[str, Any]) -> None:
    keys = list(section["overlay_vs_readonly"])
    print(f"{'root':9} " + " ".join(f"{k + ' ms':>12}" for k in keys))
    for name, row in section["ms_median"].items():
        print(f"{name:9} " + " ".join(f"{row[k]:12.2f}" for k in keys))
    print(f"{'ratio':9} " + " ".join(f"{section['overlay_vs_readonly'][k]:11.2f}x" for k in keys))
    print("(medians of alternating rounds in one run; start = create + health check + one framed shell)")
