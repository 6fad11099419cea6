"""Helpers of the inference tests: prompts of ordinary ids and `t1-inference` child processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def prompt(n: int, seed: int = 0, vocab: int = 1024) -> np.ndarray:
    """n ordinary token ids (no special tokens, which sit at ids < 9)."""
    return np.random.default_rng(seed).integers(16, vocab, size=n).astype(np.int32)


class ServerProcess:
    """`t1-inference` in a child process on a free loopback port."""

    def __init__(self, model_dir: Path, *extra: str) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "T1_API_TOKEN": ""}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "t1.cli.inference", "--model", str(model_dir), "--backend", "torch",
             "--port", "0", "--set", "inference.server.num_threads=1", "--set", "logging.level=WARNING", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        self.address = self._wait_address()

    def _wait_address(self, timeout_s: float = 120.0) -> str:
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"listening on (\S+)", line)
            if m:
                return m.group(1)
        self.kill()
        raise RuntimeError("t1-inference did not start:\n" + "".join(lines))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
