"""Child services of the local run: t1-inference and t1-trainer started as processes with the same config.

A child is started with `--config FILE` plus the coordinator's overrides and a port of 0; it
prints `... listening on HOST:PORT` once it serves, which is how the coordinator learns its
address. Its output goes to `<run_dir>/logs/<name>.log`. Stopping sends SIGTERM, waits the
grace period, then SIGKILL. A child also gets SIGTERM from the kernel when the coordinator dies
(t1/coordinator/lifeline.py), so a killed coordinator leaves no service behind.
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

from t1.coordinator.lifeline import lifeline_argv

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


class ChildFailed(RuntimeError):
    """A child service exited or never said where it listens."""


@dataclass(slots=True)
class Child:
    name: str
    argv: list[str]
    log_path: Path
    address: str = ""
    proc: asyncio.subprocess.Process | None = None
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
            *lifeline_argv(self.argv), stdout=asyncio.subprocess.PIPE, stderr=logf, env=child_env, start_new_session=True)
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
            raise ChildFailed(f"{self.name} did not start serving within {timeout_s:.0f}s; see {self.log_path}") from None
        self._pump = asyncio.get_running_loop().create_task(self._copy_stdout(), name=f"{self.name}-stdout")
        log.info("%s (pid %d) serving on %s", self.name, self.proc.pid, self.address)
        return self.address

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


def service_argv(module: str, config: str | None, overrides: list[str], extra: list[str]) -> list[str]:
    """`python -m <module> --config FILE --set ... <extra>` with this interpreter."""
    argv = [sys.executable, "-m", module]
    if config:
        argv += ["--config", config]
    for o in overrides:
        argv += ["--set", o]
    return argv + extra
