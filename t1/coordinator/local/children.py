"""Child services of the local run: t1-inference and t1-trainer started as processes with the same config.

A child is started with `--config FILE` plus the coordinator's overrides and a port of 0; it
prints `... listening on HOST:PORT` once it serves, which is how the coordinator learns its
address. Its output goes to `<run_dir>/logs/<name>.log`. Stopping sends SIGTERM, waits the
grace period, then SIGKILL. A child also gets SIGTERM from the kernel when the coordinator dies
(t1/coordinator/local/lifeline.py), so a killed coordinator leaves no service behind.

A child that exits on its own while it serves is noticed by the local stack's supervisor
(t1/coordinator/local/local_stack.py): `restart` starts it again on the port it had, so its address, which
the rest of the run holds, stays valid.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from t1.coordinator.local.lifeline import lifeline_argv
from t1.errors import T1Error

log = logging.getLogger(__name__)

_LISTENING = re.compile(rb"listening on (\S+:\d+)")
# torch.distributed's rendezvous: a local child is a process group of its own. Inherited, a trainer child would
# try to listen on the MASTER_PORT that a trainer in this process (or its launcher) already holds.
RENDEZVOUS_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def torch_extensions_dir() -> str:
    """Where DeepSpeed builds and finds its CPU ops: TORCH_EXTENSIONS_DIR, else this virtualenv's own folder, which
    `make setup` fills (scripts/setup.sh), so a first run does not compile them and checkouts sharing a machine
    do not rebuild (and wait on) each other's copy of the same op."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path(sys.prefix) / "torch_extensions")


class ChildFailed(T1Error, RuntimeError):
    """A child service exited or never said where it listens."""


@dataclass(slots=True)
class Child:
    name: str
    argv: list[str]
    log_path: Path
    address: str = ""
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    _pump: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self, timeout_s: float, env: dict[str, str] | None = None) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = self.log_path.open("ab")
        inherited = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS_ENV}
        child_env = {**inherited, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                     "TOKENIZERS_PARALLELISM": "false", "TORCH_EXTENSIONS_DIR": torch_extensions_dir(), **(env or {})}
        self.proc = await asyncio.create_subprocess_exec(
            *lifeline_argv(self.argv),
            stdout=asyncio.subprocess.PIPE,
            stderr=logf,
            env=child_env,
            start_new_session=True,
        )
        logf.close()
        assert self.proc.stdout is not None
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    line = await self.proc.stdout.readline()
                    if not line:
                        code = await self.proc.wait()
                        raise ChildFailed(f"{self.name} exited with {code} before serving; see {self.log_path}")
                    with self.log_path.open("ab") as f:
                        f.write(line)
                    match = _LISTENING.search(line)
                    if match:
                        self.address = match.group(1).decode()
                        break
        except TimeoutError:
            await self.stop(0)
            raise ChildFailed(f"{self.name} did not start serving within {timeout_s:.0f}s; see "
                              f"{self.log_path}") from None
        self._pump = asyncio.get_running_loop().create_task(self._copy_stdout(), name=f"{self.name}-stdout")
        log.info("%s (pid %d) serving on %s", self.name, self.proc.pid, self.address)
        return self.address

    @property
    def exited(self) -> bool:
        """It had started serving and has exited since (stop() was not asked for)."""
        return bool(self.address) and self.proc is not None and self.proc.returncode is not None

    def describe_exit(self) -> str:
        """How it ended, for an error: `trainer (pid 12) was killed by SIGKILL; see <log>`."""
        assert self.proc is not None and self.proc.returncode is not None
        code = self.proc.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        return f"{self.name} (pid {self.proc.pid}) {how}; see {self.log_path}"

    async def restart(self, timeout_s: float, env: dict[str, str] | None = None) -> str:
        """Start it again after it exited, on the port it served on; returns its address (the same)."""
        if self._pump is not None:
            await asyncio.wait({self._pump})  # its output ended with the process
        port = self.address.rsplit(":", 1)[1]
        self.argv = with_port(self.argv, port)
        self.restarts += 1
        address = self.address
        self.address = ""
        await self.start(timeout_s, env)
        if self.address != address:
            raise ChildFailed(f"{self.name} came back on {self.address}, not {address}; see {self.log_path}")
        return address

    async def _copy_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with self.log_path.open("ab") as f:
            while line := await self.proc.stdout.readline():
                f.write(line)
                f.flush()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def stop(self, grace_s: float) -> int | None:
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace_s):
                    await self.proc.wait()
            except TimeoutError:
                log.warning("%s did not stop within %.0fs: killing it", self.name, grace_s)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        return self.proc.returncode


def with_port(argv: list[str], port: str) -> list[str]:
    """`argv` with its `--port` value set to `port` (pure)."""
    i = len(argv) - 1 - argv[::-1].index("--port")
    return [*argv[:i + 1], port, *argv[i + 2:]]


def service_argv(module: str, config: str | None, overrides: list[str], extra: list[str]) -> list[str]:
    """`python -m <module> --config FILE --set ... <extra>` with this interpreter."""
    argv = [sys.executable, "-m", module]
    if config:
        argv += ["--config", config]
    for o in overrides:
        argv += ["--set", o]
    return argv + extra
