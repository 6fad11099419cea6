"""What the session's smoke run shows a person: its eval summaries with Wilson intervals, attempts and family
rows, the learning-curve PNG beside its run log named in the last line printed, and a console without
per-episode lines (they are in the run's log file)."""

from __future__ import annotations

import json
import re

from smoke_run import SMOKE_TIMEOUT, SmokeRun

from t1.coordinator.run.console_report import LABEL_ORDER
from t1.evals.stats import wilson_interval
from t1.view.learning_png import read_panels

PANELS = ["Training reward", "Training solve rate", "KL", "Train-inference |dlogp|", "Entropy", "Clip fraction",
          "Explained variance", "Policy lag"]


@SMOKE_TIMEOUT
def test_eval_summaries_carry_intervals_attempts_and_families(smoke_run: SmokeRun) -> None:
    assert smoke_run.rc == 0, smoke_run.log[-4000:]
    report = json.loads((smoke_run.run_dir / "report.json").read_text())
    labels = [label for label in LABEL_ORDER if label in report]
    assert len(labels) >= 2, report
    attempts_per_task = smoke_run.config["coordinator"]["eval"]["attempts"]
    for label in labels:
        s = report[label]["heldout"]
        assert s["ci_method"] == "wilson" and s["state"] == "succeeded"
        assert s["attempts"] + s["infra_errors"] == s["num_tasks"] * attempts_per_task
        assert s["ci95"] == list(wilson_interval(s["resolved"], s["attempts"]))
        assert s["ci95"][0] <= s["resolve_rate"] <= s["ci95"][1]
        families = s["by_family"]
        assert families and sum(f["attempts"] for f in families.values()) == s["attempts"]
        assert all(not re.search(r"-(eval|train)-\d+$", name) for name in families), families


@SMOKE_TIMEOUT
def test_learning_curves_png_beside_the_run_log_named_in_the_last_line(smoke_run: SmokeRun) -> None:
    assert smoke_run.rc == 0, smoke_run.log[-4000:]
    report = json.loads((smoke_run.run_dir / "report.json").read_text())
    png = smoke_run.run_dir / "learning_curves.png"
    assert report["curves_png"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    panels = {p["title"]: p["points"] for p in read_panels(png)}
    assert list(panels) == PANELS
    assert panels["Training reward"] >= 1 and panels["KL"] >= 1, panels  # the PPO step's metrics
    last = smoke_run.log.rstrip().splitlines()[-1]
    assert last.startswith("t1: run local-small done") and f"learning curves {png}" in last, last


@SMOKE_TIMEOUT
def test_console_keeps_episode_lines_in_the_log_file(smoke_run: SmokeRun) -> None:
    assert smoke_run.rc == 0, smoke_run.log[-4000:]
    console = smoke_run.log
    file_log = (smoke_run.run_dir / "logs" / "coordinator.log").read_text(errors="replace")
    episode = re.compile(r"episode \S+ \(\S+\): \w+, reward")
    assert episode.search(file_log) and not episode.search(console)
    assert "t1: stage training" in console and "t1: stage training" in file_log
    assert "event loop lag" not in console or re.search(r"event loop lag \d{5,} ms", console)
    assert "\x1b[" not in console, "not a terminal: plain lines"
