"""`t1-inference` validates its config and model folder before importing torch, exiting 2 on bad input."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import sys
from t1.cli.inference import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    print("exit", exc.code, "torch" in sys.modules)
"""


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "inference.server.max_batch=0"], "inference.server.max_batch"),
    (["--port", "70000"], "inference.server.server.port"),
    (["--model", "/nonexistent/model", "--set", "inference.model.init_preset=null"], "inference.model.path"),
])
def test_bad_config_exits_2_without_importing_torch(args: list[str], message: str) -> None:
    proc = run(*args)
    assert "exit 2 False" in proc.stdout, proc.stdout + proc.stderr
    assert message in proc.stderr


def test_vllm_backend_without_vllm_is_a_clear_error(tiny_model_dir: Path) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    proc = run("--backend", "vllm", "--model", str(tiny_model_dir))
    assert "exit 2 False" in proc.stdout and "vllm is not installed" in proc.stderr
