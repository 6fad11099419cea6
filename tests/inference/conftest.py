"""Fixtures of the inference plane: an in-process torch backend, a loopback gRPC server, server processes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from inference_helpers import ServerProcess

from t1.config.shared import AuthConfig, ServerConfig


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    import torch

    torch.set_num_threads(1)


@pytest.fixture
async def backend(tiny_model_dir: Path):
    from t1.inference.server.torch_backend import TorchBackend

    b = TorchBackend(tiny_model_dir, chunk_tokens=4)
    yield b
    await b.close()


@pytest.fixture
async def served(backend) -> AsyncIterator[str]:
    """A real InferenceService on 127.0.0.1 over the `backend` fixture; yields its address."""
    from t1.inference.server.servicer import inference_binding
    from t1.rpc.server import GrpcServer

    server = GrpcServer([inference_binding(backend)], ServerConfig(host="127.0.0.1", port=0, grace_s=0.5), AuthConfig())
    await server.start()
    yield server.address
    await server.stop()


@pytest.fixture
def server_processes(tiny_model_dir: Path) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for s in started:
        s.kill()
