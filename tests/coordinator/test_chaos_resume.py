"""Chaos (issue 41), slow: kill -9 of the coordinator during 40-turn training episodes in local sandboxes; the run's
sandbox service outlives the coordinator and the restarted one resumes the episodes in them (chaos_resume.py has
the run and its checks; the service is gone after the run, like every other process)."""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos_resume import run_resume_chaos
from test_local_run import root  # noqa: F401  (a fixture: a root sandbox users can traverse)


@pytest.mark.slow  # a trainer, a coordinator killed twice, 40-turn episodes: about 2 minutes per seed
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_9_of_the_coordinator_resumes_live_local_episodes(root: Path, tiny_model_dir: Path,  # noqa: F811
                                                               seed: int) -> None:
    run_resume_chaos(root, tiny_model_dir, {"provider": "local", "local": {"root": str(root / "sandboxes")}}, seed)
