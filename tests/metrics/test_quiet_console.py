"""The training run's console: stage lines and real warnings on the terminal, per-episode lines and routine
event-loop lag reports in the log file only; not a TTY: plain lines, no escape codes."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

from t1.logsetup import shown_on_console

_CHILD = textwrap.dedent("""
    import logging, sys
    from pathlib import Path
    from t1.config.shared import LoggingConfig
    from t1.logsetup import setup_logging
    setup_logging(LoggingConfig(console=sys.argv[2]), "t1-coordinator", Path(sys.argv[1]))
    logging.getLogger("t1.coordinator.rollout.runner").info("episode g-a0 (task-1): ok, reward 1, 3 turns, 2.0s")
    logging.getLogger("t1.metrics.watchdog").warning("event loop lag 350 ms (threshold 100 ms); blocked in: x")
    logging.getLogger("t1.console").info("t1: stage training")
    logging.getLogger("t1.coordinator.trainer_side.trainer_link").warning(
        "trainer link to 127.0.0.1:1: UNAVAILABLE: down")
    logging.getLogger("t1.metrics.watchdog").warning("event loop lag 31000 ms (threshold 100 ms); blocked in: y")
""")


def _run(tmp_path: Path, console: str) -> tuple[str, str]:
    log = tmp_path / "logs" / "coordinator.log"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(log), console], capture_output=True, text=True,
                          timeout=60, check=True)
    return proc.stderr, log.read_text()


def test_quiet_console_shows_stage_lines_and_faults_and_the_file_keeps_everything(tmp_path: Path) -> None:
    stderr, file_text = _run(tmp_path, "auto")
    lines = stderr.splitlines()
    assert lines[0] == "t1: stage training", "a stage line as it is, no log prefix"
    assert "UNAVAILABLE: down" in stderr and "31000 ms" in stderr, "real faults still show"
    assert "episode g-a0" not in stderr and "350 ms" not in stderr
    assert len(lines) == 3 and "\x1b" not in stderr
    for text in ("episode g-a0", "350 ms", "t1: stage training", "UNAVAILABLE", "31000 ms"):
        assert text in file_text


def test_console_all_shows_every_record(tmp_path: Path) -> None:
    stderr, _ = _run(tmp_path, "all")
    assert "episode g-a0" in stderr and "350 ms" in stderr


def test_the_rule_itself() -> None:
    def rec(name: str, level: int, msg: str) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, msg, None, None)

    assert shown_on_console(rec("t1.console", logging.INFO, "t1: stage x"))
    assert not shown_on_console(rec("t1.coordinator.run.app", logging.INFO, "coordinator serving"))
    assert shown_on_console(rec("t1.coordinator.run.app", logging.ERROR, "boom"))
    assert not shown_on_console(rec("t1.metrics.watchdog", logging.WARNING, "event loop lag 29999 ms (x)"))
    assert shown_on_console(rec("t1.metrics.watchdog", logging.WARNING, "event loop lag 30000 ms (x)"))
