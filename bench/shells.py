"""Shell round trips and concurrent shells: framed shell vs exec-per-command vs tmux polling.

Run: .venv/bin/python bench/shells.py [--commands 300] [--shells 1000] [--out FILE] [--cpu-only | --rootfs]

Against a loopback OpenSSH sshd and the embedded server (bubblewrap on) it measures, for a
trivial command, the round trip (p50/p99) and commands per second of
  (a) the persistent framed shell (`SshShell.run`),
  (b) one SSH exec channel per command,
  (c) Terminal-Bench harness style: `tmux send-keys` then `tmux capture-pane` polling, each an exec;
then how many idle framed shells one process holds open at once and the client memory per
shell (RSS growth of this process / shells). For the concurrency run the embedded server lives
in a child process so that its memory is not counted as client memory.

The client-CPU section measures what a coordinator pays per `SshShell.run("true")`: process CPU
time (user + system) of this process over many commands, with the server in another process.
It compares cipher settings side by side in one run, rounds alternating between them, because
the machine is noisy: chacha20-poly1305 alone (asyncssh's default choice) against T1's
preference list (`ssh_sandbox.CIPHERS`), each against sshd and the embedded server.

`--rootfs` measures only what the copy-on-write root costs (`bench.rootfs_cost`): sandbox start
and per-command time with `overlay: true` and `false`, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncssh

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.rpc.loop import run as run_on_coordinator_loop
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.ssh.ssh_sandbox import CIPHERS, SshEndpoint, SshSandbox
from t1.sandbox.ssh.ssh_shell import SshShell
from t1.sandbox.ssh.sshd import SshdProcess
from t1.sandbox.types import SandboxRequest

SHELL_CFG = ShellConfig()
CIPHER_SETTINGS = {"chacha20": ("chacha20-poly1305@openssh.com",), "preferred": CIPHERS}
"""Client cipher settings compared by the CPU section: asyncssh's default pick, and T1's list."""


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(latencies: list[float], wall_s: float) -> dict[str, float]:
    return {"p50_ms": 1000 * statistics.median(latencies), "p99_ms": 1000 * _pct(latencies, 0.99),
            "cmds_per_s": len(latencies) / wall_s, "n": len(latencies)}


async def bench_framed(sandbox: SshSandbox, n: int) -> dict[str, float]:
    shell = await sandbox.open_shell()
    for _ in range(10):
        await shell.run("true")
    lat, start = [], time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        result = await shell.run("true")
        lat.append(time.perf_counter() - t)
        assert result.exit_code == 0
    out = _summary(lat, time.perf_counter() - start)
    await shell.close()
    return out


async def bench_exec(sandbox: SshSandbox, n: int) -> dict[str, float]:
    lat, start = [], time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        result = await sandbox.conn.run("true", check=True)
        lat.append(time.perf_counter() - t)
        assert result.exit_status == 0
    return _summary(lat, time.perf_counter() - start)


async def bench_tmux(sandbox: SshSandbox, n: int, scratch: str) -> dict[str, float]:
    """send-keys + capture-pane polling, every tmux call its own exec (as a harness does with docker exec)."""
    keeper = await sandbox.open_shell()  # keeps the tmux server's sandbox session (PID namespace) alive
    sock = f"{scratch}/t1-bench-tmux.sock"
    started = await keeper.run(f"tmux -S {sock} new-session -d -s b -x 200 -y 50 && echo ok", timeout_s=20)
    assert "ok" in started.output, started
    lat, polls, start = [], 0, time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        await sandbox.conn.run(f"tmux -S {sock} send-keys -t b 'echo d{i}x' Enter", check=True)
        while True:
            polls += 1
            pane = await sandbox.conn.run(f"tmux -S {sock} capture-pane -p -t b", check=True)
            if f"\nd{i}x" in str(pane.stdout):
                break
        lat.append(time.perf_counter() - t)
    out = _summary(lat, time.perf_counter() - start)
    out["polls_per_cmd"] = polls / n
    await keeper.run(f"tmux -S {sock} kill-server")
    await keeper.close()
    return out


async def client_cpu(endpoints: dict[str, SshEndpoint], n: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Process CPU ms per framed round trip for each named endpoint setting, rounds alternating."""
    boxes = {name: await SshSandbox.connect(name, endpoint, SHELL_CFG) for name, endpoint in endpoints.items()}
    try:
        shells = {name: await box.open_shell() for name, box in boxes.items()}
        for shell in shells.values():
            for _ in range(20):
                await shell.run("true")
        per_round: dict[str, list[float]] = {name: [] for name in shells}
        for _ in range(rounds):
            for name, shell in shells.items():
                gc.collect()
                start = time.process_time()
                for _ in range(n):
                    await shell.run("true")
                per_round[name].append(1000 * (time.process_time() - start) / n)
        return {name: {"cpu_ms_per_cmd": statistics.median(ms), "min_ms": min(ms), "rounds_ms": ms,
                       "cipher": boxes[name].conn.get_extra_info("send_cipher"), "n": n * rounds}
                for name, ms in per_round.items()}
    finally:
        for box in boxes.values():
            await box.close()


async def cpu_section(n: int, rounds: int) -> dict[str, Any]:
    """`client_cpu` for every cipher setting against sshd and against an embedded server in a child process."""
    out: dict[str, Any] = {"loop": type(asyncio.get_running_loop()).__module__}
    sshd_proc = SshdProcess()
    try:
        sshd = sshd_proc.start().endpoint()
        out["sshd"] = await client_cpu(
            {name: dataclasses.replace(sshd, ciphers=algs) for name, algs in CIPHER_SETTINGS.items()}, n, rounds)
    finally:
        sshd_proc.stop()
    async with embedded_server(len(CIPHER_SETTINGS)) as spec:
        sandboxes = [e for _, e in _endpoints({**spec, "users": spec["ids"]})]  # one sandbox per setting
        settings = zip(CIPHER_SETTINGS.items(), sandboxes, strict=True)
        out["embedded"] = await client_cpu(
            {name: dataclasses.replace(e, ciphers=algs) for (name, algs), e in settings}, n, rounds)
    return out


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def hold_shells(endpoints: list[tuple[str, SshEndpoint]], parallel: int = 16) -> dict[str, Any]:
    """Open one connection + framed shell per endpoint, all at once held idle; memory per shell."""
    gc.collect()
    before = _rss_kb()
    gate = asyncio.Semaphore(parallel)
    held: list[tuple[SshSandbox, SshShell]] = []
    failures: list[str] = []

    async def open_one(sandbox_id: str, endpoint: SshEndpoint) -> None:
        async with gate:
            try:
                box = await SshSandbox.connect(sandbox_id, endpoint, SHELL_CFG)
                shell = await box.open_shell()
                assert isinstance(shell, SshShell)
                held.append((box, shell))
            except Exception as exc:  # counted and reported: the point is how many succeed
                failures.append(f"{type(exc).__name__}: {exc}")

    start = time.perf_counter()
    await asyncio.gather(*(open_one(i, e) for i, e in endpoints))
    open_s = time.perf_counter() - start
    gc.collect()
    after = _rss_kb()
    # every held shell still answers
    answers = await asyncio.gather(*(sh.run("echo $$", timeout_s=60) for _, sh in held))
    ok = sum(r.exit_code == 0 for r in answers)
    for box, _ in held:
        await box.close()
    return {"requested": len(endpoints), "open": len(held), "answered": ok, "open_s": open_s,
            "client_kb_per_shell": (after - before) / max(1, len(held)), "failures": len(failures),
            "first_failure": failures[0] if failures else ""}


async def _serve_embedded(n: int, root: str) -> None:
    """Child process: an embedded server with n registered sandbox trees; prints how to reach them."""
    from t1.sandbox.isolation.bwrap import SandboxTree, make_tree

    provider = LocalProvider(LocalProviderConfig(root=Path(root)), SHELL_CFG)
    await provider.start()
    server = provider.server
    ids = []
    for i in range(n):
        sid = f"sb-bench-{i}"
        tree = SandboxTree(sid, provider.root / sid, provider._new_uid(), False, provider.cfg.limits)
        make_tree(tree)
        server.trees[sid] = tree
        ids.append(sid)
    key_file = Path(root) / "client_key"
    server.client_key.write_private_key(str(key_file))
    print(json.dumps({"port": server.port, "ids": ids, "key_file": str(key_file),
                      "host_key": server.host_key.export_public_key().decode()}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    await server.close()


def _endpoints(spec: dict[str, Any]) -> list[tuple[str, SshEndpoint]]:
    host_keys = (asyncssh.import_public_key(spec["host_key"]),) if spec.get("host_key") else ()
    return [(f"{user}-{i}", SshEndpoint("127.0.0.1", spec["port"], user, client_keys=(spec["key_file"],),
                                        known_hosts=spec.get("known_hosts"), host_keys=host_keys))
            for i, user in enumerate(spec["users"])]


async def hold_in_fresh_client(spec: dict[str, Any]) -> dict[str, Any]:
    """Run `hold_shells` in a new Python process so its RSS growth is the client's alone."""
    client = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--client", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await client.communicate(json.dumps(spec).encode())
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


@contextlib.asynccontextmanager
async def embedded_server(n: int) -> AsyncIterator[dict[str, Any]]:
    """An embedded server with n sandboxes in a child process (its CPU and memory are not ours)."""
    root = tempfile.mkdtemp(prefix="t1-bench-")
    os.chmod(root, 0o711)
    server = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve-embedded", str(n), "--root", f"{root}/trees",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 24,
    )
    assert server.stdout is not None and server.stdin is not None
    try:
        yield json.loads(await server.stdout.readline())
    finally:
        server.stdin.close()
        await server.wait()


async def concurrent_embedded(n: int) -> dict[str, Any]:
    async with embedded_server(n) as info:
        return await hold_in_fresh_client({"port": info["port"], "key_file": info["key_file"],
                                           "host_key": info["host_key"], "users": info["ids"]})


async def main(args: argparse.Namespace) -> dict[str, Any]:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results: dict[str, Any] = {"machine": f"{platform.node()} {os.cpu_count()} cpus {platform.platform()}",
                               "settings": vars(args).copy()}
    sshd_proc = SshdProcess()
    sshd = sshd_proc.start()
    root = tempfile.mkdtemp(prefix="t1-bench-")
    os.chmod(root, 0o711)
    provider = LocalProvider(LocalProviderConfig(root=Path(root) / "trees"), SHELL_CFG)
    try:
        sshd_box = await SshSandbox.connect("sshd", sshd.endpoint(), SHELL_CFG)
        servers = {"sshd": (sshd_box, sshd_proc.work), "embedded": (await provider.create(SandboxRequest()), "/tmp")}
        for name, (box, scratch) in servers.items():
            assert isinstance(box, SshSandbox)
            results[name] = {
                "framed": await bench_framed(box, args.commands),
                "exec": await bench_exec(box, max(20, args.commands // 5)),
                "tmux": await bench_tmux(box, box_tmux_n(args), str(scratch)),
            }
        await sshd_box.close()
        results["concurrent"] = {
            "embedded": await concurrent_embedded(args.shells),
            "sshd": await hold_in_fresh_client({"port": sshd.port, "key_file": str(sshd.key_file),
                                                "known_hosts": str(sshd.known_hosts),
                                                "users": [sshd.user] * args.sshd_shells}),
        }
    finally:
        await provider.close()
        sshd_proc.stop()
    return results


def box_tmux_n(args: argparse.Namespace) -> int:
    return max(10, args.commands // 10)


def print_cpu_table(results: dict[str, Any]) -> None:
    print(f"{'server':9} {'ciphers':10} {'negotiated':30} {'CPU ms/cmd':>10} {'min':>6} {'vs chacha20':>12}")
    for server in ("sshd", "embedded"):
        settings = results["client_cpu"][server]
        base = settings["chacha20"]["cpu_ms_per_cmd"]
        for name, r in settings.items():
            print(f"{server:9} {name:10} {r['cipher']:30} {r['cpu_ms_per_cmd']:10.3f} {r['min_ms']:6.3f} "
                  f"{r['cpu_ms_per_cmd'] / base:11.2f}x")
    print(f"(client process CPU per SshShell.run('true'), median of rounds, {results['client_cpu']['loop']} loop)")
    print()


def print_table(results: dict[str, Any]) -> None:
    print_cpu_table(results)
    if "concurrent" not in results:
        return
    print(f"{'server':9} {'mode':7} {'p50 ms':>8} {'p99 ms':>8} {'cmds/s':>8} {'p50 vs framed':>14}")
    for server in ("sshd", "embedded"):
        framed = results[server]["framed"]["p50_ms"]
        for mode in ("framed", "exec", "tmux"):
            r = results[server][mode]
            print(f"{server:9} {mode:7} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['cmds_per_s']:8.0f} "
                  f"{r['p50_ms'] / framed:13.1f}x")
    print()
    print(f"{'server':9} {'shells':>7} {'open':>6} {'answered':>9} {'open s':>7} {'client KB/shell':>16}")
    for server, r in results["concurrent"].items():
        print(f"{server:9} {r['requested']:7d} {r['open']:6d} {r['answered']:9d} {r['open_s']:7.1f} "
              f"{r['client_kb_per_shell']:16.1f}")
        if r["first_failure"]:
            print(f"  first failure: {r['first_failure']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commands", type=int, default=300, help="Framed-shell commands per server (exec: /5, tmux: "
                                                                  "/10).")
    parser.add_argument("--shells", type=int, default=1000, help="Concurrent idle shells against the embedded server.")
    parser.add_argument("--sshd-shells", type=int, default=200, help="Concurrent idle shells against sshd.")
    parser.add_argument("--cpu-commands", type=int, default=400, help="Commands per setting and round, client-CPU "
                                                                      "section.")
    parser.add_argument("--cpu-rounds", type=int, default=6, help="Alternating rounds of the client-CPU section.")
    parser.add_argument("--cpu-only", action="store_true", help="Run only the client-CPU section.")
    parser.add_argument("--rootfs", action="store_true",
                        help="Run only the root-filesystem section: start and command cost, overlay vs read-only.")
    parser.add_argument("--rootfs-rounds", type=int, default=6, help="Alternating rounds of the rootfs section.")
    parser.add_argument("--rootfs-creates", type=int, default=10, help="Sandbox starts per setting and round.")
    parser.add_argument("--out", type=Path, help="Write the results as JSON here.")
    parser.add_argument("--serve-embedded", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.client:
        resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
        print(json.dumps(asyncio.run(hold_shells(_endpoints(json.loads(sys.stdin.read()))))))
        sys.exit(0)
    if cli.serve_embedded is not None:
        asyncio.run(_serve_embedded(cli.serve_embedded, cli.root))
        sys.exit(0)
    if cli.rootfs:
        from bench.rootfs_cost import print_rootfs_table, rootfs_section

        section = asyncio.run(
            rootfs_section(cli.rootfs_rounds, cli.rootfs_creates, max(20, cli.commands // 5), SHELL_CFG)
        )
        print_rootfs_table(section)
        if cli.out:
            machine = f"{platform.node()} {os.cpu_count()} cpus {platform.platform()}"
            cli.out.write_text(json.dumps({"machine": machine, "rootfs": section}, indent=2))
        sys.exit(0)
    # On the coordinator's loop (uvloop where installed), unlike the rest: the in-process embedded
    # server of `main` spawns sessions as other users, which uvloop's subprocess_exec rejects.
    cpu = run_on_coordinator_loop(cpu_section(cli.cpu_commands, cli.cpu_rounds))
    res = {"machine": f"{platform.node()} {os.cpu_count()} cpus {platform.platform()}", "settings": vars(cli).copy()}
    if not cli.cpu_only:
        res = asyncio.run(main(cli))
    res["client_cpu"] = cpu
    print_table(res)
    if cli.out:
        cli.out.write_text(json.dumps(res, indent=2, default=str))
