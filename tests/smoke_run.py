"""The smoke-sized local run, shared: its config, how to start it, and the session fixture's result type.

tests/conftest.py's `smoke_run` fixture runs it once per session (with the TensorBoard tracker on);
tests/coordinator checks the run itself, tests/view drives the viewer on its run directory,
tests/metrics reads its event files back. (W&B is tested on its own in tests/metrics: its service
process is not worth its start-up time in the suite's one full run.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml


def small_config(root: Path, model_dir: Path, max_steps: int = 1) -> dict:
    return {
        "name": "local-small",
        "sandbox": {"provider": "local", "local": {"root": str(root / "sandboxes")}, "pool": {"max_sandboxes": 3}},
        "tasks": {"sets": {"train": {"path": str(root / "tasks/train"), "split": "train", "synth": 2, "synth_seed": 1},
                           "heldout": {"path": str(root / "tasks/heldout"), "split": "eval", "synth": 1,
                                       "synth_seed": 4}},
                  "train": ["train"], "eval": ["heldout"]},
        "rollout": {"max_turns": 2, "max_context_tokens": 2048, "group_size": 2, "max_concurrent_episodes": 3,
                    "sampling": {"max_tokens": 32}},
        "reward": {"mode": "count"},
        "inference": {"model": {"path": str(model_dir), "init_preset": "tiny"}, "server": {"max_batch": 4},
                      "pool": {"num_local_servers": 1, "request_timeout_s": 120}},
        "trainer": {"work_dir": str(root / "trainer"), "max_steps": max_steps,
                    "rl": {"groups_per_step": 1, "max_policy_lag": 1, "token_budget": 4096},
                    "warm_start": {"sft_steps": 1, "critic_warmup_steps": 1,
                                   "demos_path": str(root / "run/demos.msgpack")}},
        "coordinator": {"run_dir": str(root / "run"), "server": {"port": 0},
                        "eval": {"attempts": 1, "concurrency": 2}, "shutdown_grace_s": 5},
        "metrics": {"port": 0},
    }


def start_coordinator(root: Path, cfg: dict, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    path = root / "local.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = root / "coordinator.log"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }  # the trainer's op folder: children.torch_extensions_dir
    proc = subprocess.Popen([sys.executable, "-m", "t1.cli.coordinator", "--config", str(path)], cwd=root,
                            stdout=out.open("wb"), stderr=subprocess.STDOUT, env=env)
    return proc, out


@dataclass(frozen=True)
class SmokeRun:
    """A finished smoke run: its root (tasks/, run/, trainer/ inside), config, exit code and log."""

    root: Path
    config: dict[str, Any]
    rc: int | None
    log: str

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def trainer_dir(self) -> Path:
        return self.root / "trainer"

    def events(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "run.jsonl").read_text().splitlines()]


# The run takes 1.5-3 minutes here; a busy shared machine has needed more than 4 (the trainer's start).
# Tests that use the run carry SMOKE_TIMEOUT: whichever asks first pays for it.
RUN_TIMEOUT_S = 480
SMOKE_TIMEOUT = pytest.mark.timeout(RUN_TIMEOUT_S + 90)


def run_smoke(root: Path, model_dir: Path, timeout_s: float = RUN_TIMEOUT_S) -> SmokeRun:
    """The smoke run with the TensorBoard tracker on; waits for it to end."""
    cfg = small_config(root, model_dir)
    cfg["metrics"]["trackers"] = ["tensorboard"]
    proc, out = start_coordinator(root, cfg)
    try:
        rc: int | None = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        if proc.poll() is None:  # SIGTERM first: the coordinator stops its inference and trainer children
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return SmokeRun(root, cfg, rc, out.read_text(errors="replace"))
