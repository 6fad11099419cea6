"""Chaos (issue 41), slow: kill -9 of the coordinator during 40-turn training episodes in docker sandboxes; the
restarted coordinator resumes them in their containers (tests/coordinator/chaos_resume.py has the run and its
checks), and no container is left after the run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from private_dockerd import PrivateDockerd, docker_config
from test_docker_provider import t1_containers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "coordinator"))
from chaos_resume import run_resume_chaos


@pytest.mark.slow  # a trainer, a coordinator killed twice, 40-turn docker episodes: about 2 minutes per seed
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_9_of_the_coordinator_resumes_live_episodes_from_their_last_turn(
        tmp_path: Path, tiny_model_dir: Path, dockerd: PrivateDockerd, seed: int) -> None:
    docker = docker_config(dockerd, memory_mb=256, pids=64).model_dump(mode="json")
    run_resume_chaos(tmp_path, tiny_model_dir, {"provider": "docker", "docker": docker}, seed)
    assert t1_containers(dockerd) == []
