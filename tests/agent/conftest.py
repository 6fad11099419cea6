"""Fixtures of the agent tests: the tiny model's tokenizer and renderers, a local sandbox provider."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from t1.agent.formats import FormatName, get_format
from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.local import LocalProvider
from t1.tito import ChatRenderer


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="session")
def renderers(tokenizer) -> dict[FormatName, ChatRenderer]:
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
    p = LocalProvider(LocalProviderConfig(root=sandbox_root / "trees"), ShellConfig(output_cap_bytes=4096))
    yield p
    await p.close()
