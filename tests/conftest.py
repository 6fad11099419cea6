"""Fixtures shared by every plane's tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-init Qwen3-MoE (t1.model.init, preset tiny, seed 0), made once per test session.

    Treat it as read-only: copy it before changing anything in it.
    """
    from t1.model.init import init_model

    return init_model(tmp_path_factory.mktemp("models") / "tiny", "tiny", seed=0)
