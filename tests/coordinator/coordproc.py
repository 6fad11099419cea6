"""Helpers of the coordinator tests: Harbor task folders, and a t1-coordinator child process (start, SIGTERM, kill
-9)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml


class CoordinatorProcess:
    def __init__(self, workdir: Path, config: dict) -> None:
        self.workdir = workdir
        self.config_path = workdir / "coordinator.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.run_dir = Path(config["coordinator"]["run_dir"])
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.starts = 0

    def start(self, timeout_s: float = 90.0) -> str:
        (self.run_dir / "coordinator.json").unlink(missing_ok=True)
        self.starts += 1
        log = (self.workdir / f"coordinator-{self.starts}.log").open("wb")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "t1.cli.coordinator", "--config", str(self.config_path)],
                                     stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        info = self.run_dir / "coordinator.json"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"coordinator exited with {self.proc.returncode}: {self.log_text()[-3000:]}")
            if info.is_file():
                data = json.loads(info.read_text())
                if data["pid"] == self.proc.pid:
                    self.address = data["address"]
                    return self.address
            time.sleep(0.1)
        raise TimeoutError(f"coordinator did not start: {self.log_text()[-3000:]}")

    def log_text(self) -> str:
        return (self.workdir / f"coordinator-{self.starts}.log").read_text(errors="replace")

    def terminate(self, timeout_s: float = 60.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def eval_config(tmp: Path, model_dir: Path, sandbox_root: Path, **coordinator: object) -> dict:
    """An eval-only coordinator whose policy types each task's reference solution."""
    return {
        "name": "test",
        "sandbox": {"local": {"root": str(sandbox_root / "trees")}},
        "rollout": {"policy": "oracle_script"},
        "inference": {"model": {"path": str(model_dir)}},
        "coordinator": {"run_dir": str(tmp / "run"), "train": False, "server": {"port": 0}, **coordinator},
        "metrics": {"port": 0},
    }


def write_harbor_task(root: Path, name: str, word: str, timeout_s: float = 60.0, answer: str | None = None,
                      solve_delay_s: float = 0.0) -> Path:
    """A task whose verifier checks /app/answer.txt holds `word`; the oracle writes `answer` (default: word)."""
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "solution").mkdir()
    (d / "task.toml").write_text(
        f'version = "1.0"\n[task]\nname = "{name}"\n[agent]\ntimeout_sec = {timeout_s}\n'
        '[verifier]\ntimeout_sec = 30\n[environment]\nworkdir = "/app"\n')
    (d / "instruction.md").write_text(f"Write the word {word} into /app/answer.txt.\n")
    (d / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        f'if [ "$(cat /app/answer.txt 2>/dev/null)" = "{word}" ]; then echo 1 > /logs/verifier/reward.txt; '
        "else echo 0 > /logs/verifier/reward.txt; fi\n")
    delay = f"sleep {solve_delay_s}\n" if solve_delay_s else ""
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{delay}echo {answer or word} > /app/answer.txt\n")
    return d
