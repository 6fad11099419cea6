"""Fixtures shared by every plane's tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from smoke_run import SmokeRun, run_smoke

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-init Qwen3-MoE (t1.model.init, preset tiny, seed 0), made once per test session.

    Treat it as read-only: copy it before changing anything in it.
    """
    from t1.model.init import init_model

    return init_model(tmp_path_factory.mktemp("models") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def smoke_run(tiny_model_dir: Path) -> Iterator[SmokeRun]:
    """The smoke-sized local run (tests/smoke_run.py), made once per session; treat its files as read-only."""
    root = Path(tempfile.mkdtemp(prefix="t1-smoke-run-"))
    root.chmod(0o711)  # sandbox users must traverse to their trees
    try:
        yield run_smoke(root, tiny_model_dir)
    finally:  # also when the run itself failed or timed out
        shutil.rmtree(root, ignore_errors=True)
