"""Providers side by side in one run (`bench/sandbox_ramp.py --providers local,docker`): start, round trip, how many
fit.

`local` is the local provider with its sandboxes in the benchmark's own process (tests, the CLI);
`local-service` the same in a coordinator's run, where they live in the run's sandbox service
process (`t1.sandbox.local.service`): `--providers local,local-service` measures what that process costs.

For each provider, alternating round by round: sandbox start (create + the first command on a new
framed shell), command round trip (`true` on a live framed shell), then a ramp that keeps creating
sandboxes (each holding one shell) until `--fit` are live (the bound: 100 by default), a creation
fails, or available memory falls under `--min-free-gib`, recording the processes the ramp added on
the host and their resident memory per live sandbox (RSS counts shared pages once per process: an
upper bound). `own_cpu_ms_per_command` is the CPU of the benchmark's own process per round trip
(median of the rounds): the coordinator's share of a command. The docker provider needs an engine: `--socket` uses a
running one (the image
`--image` must be on it); without it a private dockerd is started (tests/docker/private_dockerd.py)
with the base image made from the host's files.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "docker")]

import psutil  # noqa: E402

from bench.machine_info import machine  # noqa: E402
from t1.config.sandbox import DockerProviderConfig, LocalProviderConfig, ShellConfig  # noqa: E402
from t1.sandbox.docker.docker_provider import DockerProvider  # noqa: E402
from t1.sandbox.local.local_provider import LocalProvider  # noqa: E402
from t1.sandbox.types import SandboxProvider, SandboxRequest  # noqa: E402

SETTINGS = ("providers", "rounds", "creates", "commands", "fit", "min_free_gib", "socket", "image")


async def _start_once(provider: SandboxProvider) -> tuple[float, Any]:
    t0 = time.perf_counter()
    sandbox = await provider.create(SandboxRequest())
    shell = await sandbox.open_shell()
    assert (await shell.run("echo t1-ok")).output.strip() == "t1-ok"
    return time.perf_counter() - t0, sandbox


async def start_and_round_trip(provider: SandboxProvider, creates: int, commands: int) -> dict[str, list[float]]:
    starts, trips = [], []
    for _ in range(creates):
        took, sandbox = await _start_once(provider)
        starts.append(took)
        await provider.destroy(sandbox)
    _, sandbox = await _start_once(provider)
    shell = await sandbox.open_shell()
    cpu0 = time.process_time()
    for _ in range(commands):
        t0 = time.perf_counter()
        await shell.run("true")
        trips.append(time.perf_counter() - t0)
    cpu = (time.process_time() - cpu0) / max(1, commands)
    await provider.destroy(sandbox)
    return {"start_s": starts, "round_trip_s": trips, "own_cpu_s": [cpu]}


async def fit(provider: SandboxProvider, most: int, min_free_gib: float) -> dict[str, Any]:
    live: list[Any] = []
    why = f"reached --fit {most}"
    before = set(psutil.pids())
    t0 = time.perf_counter()
    while len(live) < most:
        if psutil.virtual_memory().available < min_free_gib * 2**30:
            why = f"available memory under {min_free_gib} GiB"
            break
        try:
            live.append((await _start_once(provider))[1])
        except Exception as exc:
            why = f"create failed: {exc}"[:200]
            break
    new = [pid for pid in psutil.pids() if pid not in before]
    rss = 0
    for pid in new:  # the sandboxes' processes and the engine's shims: every process the ramp added
        with contextlib.suppress(psutil.Error):
            rss += psutil.Process(pid).memory_info().rss
    elapsed = time.perf_counter() - t0
    for sandbox in live:
        await provider.destroy(sandbox)
    return {"live": len(live), "stopped": why, "rss_mib_per_sandbox": rss / max(1, len(live)) / 2**20,
            "processes_per_sandbox": len(new) / max(1, len(live)),
            "ramp_s": elapsed}


def _med(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else float("nan")


async def main_async(args: argparse.Namespace, socket: Path | None, sandbox_root: Path) -> dict[str, Any]:
    shell_cfg = ShellConfig(command_timeout_s=60)
    providers: dict[str, SandboxProvider] = {}
    for name in args.providers:
        if name == "local":
            providers[name] = LocalProvider(LocalProviderConfig(root=sandbox_root), shell_cfg)
        elif name == "local-service":  # a coordinator's run: the sandboxes in the run's sandbox service process
            providers[name] = LocalProvider(LocalProviderConfig(root=sandbox_root.with_name("service-sandboxes")),
                                            shell_cfg, run_dir=sandbox_root.with_name("run"))
        elif name == "docker":
            assert socket is not None
            providers[name] = DockerProvider(DockerProviderConfig(socket=socket, default_image=args.image), shell_cfg)
        else:
            raise SystemExit(f"--providers: unknown provider {name!r} (local, local-service, docker)")
    samples: dict[str, dict[str, list[float]]] = {k: {"start_s": [], "round_trip_s": [], "own_cpu_s": []}
                                                  for k in providers}
    fits: dict[str, dict[str, Any]] = {}
    try:
        for _ in range(args.rounds):
            for name, provider in providers.items():
                for key, values in (await start_and_round_trip(provider, args.creates, args.commands)).items():
                    samples[name][key] += values
        for name, provider in providers.items():
            fits[name] = await fit(provider, args.fit, args.min_free_gib)
    finally:
        for provider in providers.values():
            await provider.close()
    rows = {name: {"start_ms_p50": _med(s["start_s"]), "round_trip_ms_p50": _med(s["round_trip_s"]),
                   "round_trip_ms_p99": sorted(s["round_trip_s"])[int(0.99 * (len(s["round_trip_s"]) - 1))] * 1000,
                   "own_cpu_ms_per_command": _med(s["own_cpu_s"]),
                   **fits[name]} for name, s in samples.items()}
    settings = {k: getattr(args, k) for k in SETTINGS}
    return {"machine": machine(), "settings": settings, "results": rows}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--providers (side by side)")
    group.add_argument("--rounds", type=int, default=3)
    group.add_argument("--creates", type=int, default=5, help="Sandbox starts per provider per round.")
    group.add_argument("--commands", type=int, default=200, help="Round trips per provider per round.")
    group.add_argument("--fit", type=int, default=100, help="Most sandboxes the ramp creates per provider (its bound).")
    group.add_argument("--min-free-gib", type=float, default=4.0)
    group.add_argument("--socket", type=Path, default=None, help="A running Docker engine (default: a private "
                                                                 "dockerd).")
    group.add_argument("--image", default="t1-test-base:latest")


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Run the side-by-side measurement (starting a private dockerd when docker is compared without --socket)."""
    with tempfile.TemporaryDirectory(prefix="t1-bench-providers-") as tmp:
        root = Path(tmp)
        root.chmod(0o711)
        engine = None
        socket = args.socket
        if socket is None and "docker" in args.providers:
            from private_dockerd import PrivateDockerd

            engine = PrivateDockerd(root / "dockerd")
            engine.start()
            engine.import_base_image()
            socket = engine.socket
        try:
            return asyncio.run(main_async(args, socket, root / "sandboxes"))
        finally:
            if engine is not None:
                engine.stop()


def print_table(report: dict[str, Any]) -> None:
    print(f"{'provider':<13} {'start p50 ms':>13} {'trip p50 ms':>12} {'trip p99 ms':>12} {'own CPU ms':>11} "
          f"{'fit':>5} "
          f"{'procs/sb':>9} {'RSS MiB/sb':>11}  stopped")
    for name, row in report["results"].items():
        print(f"{name:<13} {row['start_ms_p50']:>13.1f} {row['round_trip_ms_p50']:>12.2f} "
              f"{row['round_trip_ms_p99']:>12.2f} "
              f"{row['own_cpu_ms_per_command']:>11.3f} "
              f"{row['live']:>5} {row['processes_per_sandbox']:>9.1f} {row['rss_mib_per_sandbox']:>11.1f}  "
              f"{row['stopped']}")
    if len(report["results"]) == 2:
        (a, ra), (b, rb) = report["results"].items()
        print(f"{b}/{a}: start x{rb['start_ms_p50'] / ra['start_ms_p50']:.2f}, "
              f"round trip x{rb['round_trip_ms_p50'] / ra['round_trip_ms_p50']:.2f}")
