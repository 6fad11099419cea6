"""A child service (the trainer, the inference server) finds DeepSpeed's CPU ops where `make setup` built them."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from t1.coordinator.children import Child

_REPORT = ("import os, sys, time; open(sys.argv[1], 'w').write(os.environ['TORCH_EXTENSIONS_DIR']); "
           "print('svc listening on 127.0.0.1:1', flush=True); time.sleep(60)")


def _child_sees(tmp_path: Path) -> str:
    seen = tmp_path / "seen"

    async def main() -> None:
        child = Child("svc", [sys.executable, "-c", _REPORT, str(seen)], tmp_path / "svc.log")
        await child.start(60)
        await child.stop(5)

    asyncio.run(main())
    return seen.read_text()


def test_a_child_looks_for_the_ops_in_this_virtualenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert _child_sees(tmp_path) == str(Path(sys.prefix) / "torch_extensions")


def test_a_child_keeps_the_folder_it_was_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ops"))
    assert _child_sees(tmp_path) == str(tmp_path / "ops")
