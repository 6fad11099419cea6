"""A child service (the trainer, the inference server) finds DeepSpeed's CPU ops where `make setup` built them,
and starts a process group of its own."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from t1.coordinator.local.children import Child

_REPORT = ("import json, os, sys, time; open(sys.argv[1], 'w').write(json.dumps({k: os.environ.get(k) for k in "
           "sys.argv[2:]})); print('svc listening on 127.0.0.1:1', flush=True); time.sleep(60)")


def _child_sees(tmp_path: Path, *names: str) -> dict[str, str | None]:
    """The values of these environment variables in a real child process started by Child."""
    seen = tmp_path / "seen"

    async def main() -> None:
        child = Child("svc", [sys.executable, "-c", _REPORT, str(seen), *names], tmp_path / "svc.log")
        await child.start(60)
        await child.stop(5)

    asyncio.run(main())
    return json.loads(seen.read_text())


def test_a_child_looks_for_the_ops_in_this_virtualenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert _child_sees(tmp_path, "TORCH_EXTENSIONS_DIR") == {
        "TORCH_EXTENSIONS_DIR": str(Path(sys.prefix) / "torch_extensions")
    }


def test_a_child_keeps_the_folder_it_was_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ops"))
    assert _child_sees(tmp_path, "TORCH_EXTENSIONS_DIR") == {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ops")}


def test_a_child_does_not_inherit_a_rendezvous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer made in this process (tests, an embedding) sets RANK and MASTER_PORT here and listens on that port;
    a trainer child that inherited them failed with EADDRINUSE before serving."""
    monkeypatch.setenv("MASTER_PORT", "29512")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("T1_KEPT", "yes")
    assert _child_sees(tmp_path, "RANK", "MASTER_PORT", "T1_KEPT") == {
        "RANK": None,
        "MASTER_PORT": None,
        "T1_KEPT": "yes",
    }
