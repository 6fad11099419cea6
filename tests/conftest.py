"""Fixtures shared by every plane's tests: the tiny model, its tokenizer and renderers, a local sandbox
provider, the smoke run."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from smoke_run import SmokeRun, run_smoke

if TYPE_CHECKING:  # imported in the fixtures: the vLLM test environment lacks some of their dependencies
    from t1.agent.formats import FormatName
    from t1.sandbox.local.local_provider import LocalProvider
    from t1.tito import ChatRenderer

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# `make test` runs the suite on pytest-xdist workers (Makefile: -n 2 --dist loadgroup), each with its own session.
# The tests that share one of these costly session fixtures go to one worker, so it is made once: the smoke run
# (a whole local run) and the private Docker engine.
SHARED_ON_ONE_WORKER = ("smoke_run", "dockerd")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        shared = [name for name in SHARED_ON_ONE_WORKER if name in getattr(item, "fixturenames", ())]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))


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


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="session")
def renderers(tokenizer) -> dict[FormatName, ChatRenderer]:
    from t1.agent.formats import FormatName, get_format
    from t1.tito import ChatRenderer

    return {name: ChatRenderer(tokenizer, end_of_turn="<|im_end|>", tools=get_format(name).tools)
            for name in FormatName}


@pytest.fixture()
def sandbox_root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="t1-agent-test-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
async def provider(sandbox_root: Path) -> AsyncIterator[LocalProvider]:
    from t1.config.sandbox import LocalProviderConfig, ShellConfig
    from t1.sandbox.local.local_provider import LocalProvider

    p = LocalProvider(LocalProviderConfig(root=sandbox_root / "trees"), ShellConfig(output_cap_bytes=4096))
    yield p
    await p.close()
