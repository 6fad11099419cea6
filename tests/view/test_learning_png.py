"""The learning-curve PNG: the panels drawn from a run log's trainer records, written as a real PNG whose
panel index (titles and point counts) reads back, and panels of metrics a run never wrote say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t1.view.learning_png import PNG_NAME, learning_charts, read_panels, write_learning_png

EXPECTED = ["Training reward", "Training solve rate", "KL", "Train-inference |dlogp|", "Entropy", "Clip fraction",
            "Explained variance", "Policy lag"]


def _records() -> list[dict]:
    out: list[dict] = [{"ts": 1.0, "event": "start"}]
    episodes = resolved = 0
    for step in range(1, 6):
        episodes += 8
        resolved += step  # 1, 2, ... of 8 solved in each step's window
        metrics = {"reward_mean": 0.1 * step, "kl": 0.01 * step, "t1_train_infer_logprob_abs_diff": 0.002,
                   "entropy": 2.0 - 0.1 * step, "clip_fraction": 0.05, "explained_variance": -0.5 + 0.2 * step,
                   "policy_lag": 0.5}
        if step == 3:
            metrics["entropy"] = float("nan")  # a non-finite value is a gap, not a crash
        out.append({"ts": 1.0 + step, "event": "trainer", "step": step, "stage": "TRAINER_STAGE_PPO",
                    "metrics": metrics, "rollouts": {"episodes": episodes, "resolved": resolved, "reward_sum": 0.0}})
    return out


def test_panels_and_the_training_solve_rate_per_step_window() -> None:
    charts = learning_charts(_records(), [])
    assert [c.title for c in charts] == EXPECTED
    solve = charts[1].series[0]
    assert solve.x == (1.0, 2.0, 3.0, 4.0, 5.0) and solve.y == pytest.approx([1 / 8, 2 / 8, 3 / 8, 4 / 8, 5 / 8])
    entropy = charts[4].series[0]
    assert entropy.y[2] is None and entropy.num_points == 4
    with_sft = learning_charts(_records(), [], [{"step": 5, "solve_rate": 0.2, "attempts": 40}])
    assert with_sft[-1].title == "Warm start: validation solve rate" and with_sft[-1].num_points == 1


def test_png_is_written_beside_the_run_log_and_its_panels_read_back(tmp_path: Path) -> None:
    import matplotlib.image

    log = tmp_path / "run.jsonl"
    records = _records()
    for r in records[1:]:
        r["metrics"].pop("clip_fraction")  # a metric this run never wrote
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    png = write_learning_png(log, tmp_path / "no-trainer-here", tmp_path / PNG_NAME, "t: curves")
    assert png == tmp_path / PNG_NAME and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(png)
    assert image.shape[0] > 300 and image.shape[1] > 800 and image.std() > 0.01, "a drawn figure, not blank"
    panels = read_panels(png)
    assert [p["title"] for p in panels] == EXPECTED
    points = {p["title"]: p["points"] for p in panels}
    assert points["KL"] == 5 and points["Training solve rate"] == 5 and points["Clip fraction"] == 0
    not_png = tmp_path / "x.png"
    not_png.write_bytes(b"GIF89a")
    with pytest.raises(ValueError, match="not a PNG"):
        read_panels(not_png)


def test_t1_view_links_and_serves_the_png_once_the_run_wrote_it(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from t1.view.index import RunIndex, RunPaths
    from t1.view.server import create_app
    from t1.view.vocab import NO_VOCAB

    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    client = TestClient(create_app(RunIndex(RunPaths(tmp_path, None)), NO_VOCAB), base_url="http://127.0.0.1")
    assert 'id="learning-png"' not in client.get("/").text
    missing = client.get(f"/{PNG_NAME}")
    assert missing.status_code == 404 and "not written yet" in missing.text
    write_learning_png(log, None, tmp_path / PNG_NAME, "t")
    assert 'id="learning-png"' in client.get("/").text
    r = client.get(f"/{PNG_NAME}")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png" and r.content[:4] == b"\x89PNG"
