"""The t1-coordinator entry point: a bad config exits 2 naming each key path, before any heavy import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBE = """
import sys
from t1.cli.coordinator import main
try:
    main(["--config", sys.argv[1]])
except SystemExit as exc:
    heavy = [m for m in ("torch", "transformers", "grpc", "deepspeed", "numpy", "asyncssh") if m in sys.modules]
    print("heavy:", ",".join(heavy))
    raise
"""


def test_bad_config_exits_2_with_key_paths_before_heavy_imports(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("rollout: {max_turns: -1}\ncoordinator: {bogus: 1, spool: {max_mb: zero}}\n")
    proc = subprocess.run([sys.executable, "-c", PROBE, str(cfg)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "rollout.max_turns" in proc.stderr
    assert "coordinator.bogus: unknown key" in proc.stderr
    assert "coordinator.spool.max_mb" in proc.stderr
    assert proc.stdout.strip() == "heavy:", proc.stdout


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "t1.cli.coordinator", "--config", str(tmp_path / "nope.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "nope.yaml" in proc.stderr


def test_example_local_config_is_valid() -> None:
    from t1.config.loader import load_config

    cfg = load_config(Path(__file__).parents[2] / "examples" / "local.yaml")
    assert cfg.sandbox.provider == "local" and cfg.coordinator.train
    assert cfg.tasks.train and cfg.tasks.eval
