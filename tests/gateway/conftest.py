"""The gateway tests' model: the tiny model generating in-process (real sampling and routing capture)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def backend(tiny_model_dir):
    from t1.inference.server.torch_backend import TorchBackend

    return TorchBackend(tiny_model_dir, capture_routing=True)
