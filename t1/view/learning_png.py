"""The run's learning curves as one PNG beside its run log: training reward and solve rate, KL, train-inference
|dlogp|, entropy, clip fraction, explained variance and policy lag, against trainer step.

Trainer metrics come from the trainer's committed steps when its buffer is readable (every step),
else from the run log's `trainer` records (t1.view.curves.trainer_points). The training solve rate
is the coordinator's: each `trainer` record carries cumulative tallies of scored training episodes
(infra errors excluded), and a step's point is the episodes that finished since the record before.
A panel whose metric the run never wrote says so instead of drawing a line. The panel titles and
their point counts are stored in the PNG's Description text chunk, so a reader can check what it shows.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from t1.trainer.buffer import StepRecord
from t1.view.curves import TRAINER_CHARTS, Chart, Series, trainer_charts, trainer_points

PNG_NAME = "learning_curves.png"
REWARD_CHARTS = (("train_reward", "Training reward", (("reward_mean",), ("return_mean",))),)
SOLVE_TRAINER_KEYS = (("solve_rate", "resolve_rate", "resolved_fraction"),)


def solve_rate_chart(records: Sequence[Mapping[str, Any]], points: Sequence[tuple[int, Mapping[str, Any]]]
                     ) -> Chart:
    """Training solve rate by trainer step: episodes finished between consecutive trainer records, and the
    trainer's own solve-rate metric where it writes one."""
    xs: list[float] = []
    ys: list[float | None] = []
    prev: tuple[float, float] = (0.0, 0.0)
    for r in records:
        tallies = r.get("rollouts") if r.get("event") == "trainer" else None
        if not isinstance(tallies, Mapping):
            continue
        episodes, resolved = float(tallies.get("episodes", 0)), float(tallies.get("resolved", 0))
        if episodes > prev[0]:
            xs.append(float(r["step"]))
            ys.append((resolved - prev[1]) / (episodes - prev[0]))
        prev = (episodes, resolved)
    series = [Series("training episodes since the last step", tuple(xs), tuple(ys))] if xs else []
    trainer = trainer_charts(points, (("solve", "", SOLVE_TRAINER_KEYS),))[0]
    return Chart("train_solve_rate", "Training solve rate", "trainer step", (*series, *trainer.series))


def sft_chart(curve: Sequence[Mapping[str, Any]]) -> Chart:
    """Validation solve rate after each SFT round (report["sft_curve"])."""
    xs = tuple(float(p["step"]) for p in curve)
    ys = tuple(float(p["solve_rate"]) for p in curve)
    return Chart("sft_solve_rate", "Warm start: validation solve rate", "SFT step",
                 (Series("validation split", xs, ys),) if xs else ())


def learning_charts(records: Sequence[Mapping[str, Any]], steps: Sequence[StepRecord],
                    sft_curve: Sequence[Mapping[str, Any]] = ()) -> list[Chart]:
    """The PNG's panels, in order (pure); the SFT panel only when the run has an SFT curve."""
    points = trainer_points(steps, records)
    return [*trainer_charts(points, REWARD_CHARTS), solve_rate_chart(records, points),
            *trainer_charts(points, TRAINER_CHARTS), *([sft_chart(sft_curve)] if sft_curve else [])]


def panel_index(charts: Sequence[Chart]) -> list[dict[str, Any]]:
    return [{"key": c.key, "title": c.title, "points": c.num_points} for c in charts]


def draw_png(charts: Sequence[Chart], path: Path, title: str) -> Path:
    """Draw the panels on a grid (Agg, no display) and write the PNG; returns its path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    cols = 4
    rows = max(1, -(-len(charts) // cols))
    fig = Figure(figsize=(4.2 * cols, 3.0 * rows), dpi=80, layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title)
    for i, chart in enumerate(charts):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.set_title(chart.title, fontsize=10)
        ax.set_xlabel(chart.x_label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        drawn = False
        for s in chart.series:
            pts = [(x, y) for x, y in zip(s.x, s.y, strict=True) if y is not None]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=3, label=s.name)
                drawn = True
        if drawn:
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, "not written by this run", ha="center", va="center", transform=ax.transAxes,
                    fontsize=8, color="grey")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Title": title, "Description": json.dumps(panel_index(charts))})
    return path


def write_learning_png(run_log: Path, trainer_dir: Path | None, out: Path, title: str,
                       sft_curve: Sequence[Mapping[str, Any]] = ()) -> Path:
    """Read the run log (and the trainer's buffer if readable) and draw the curves to `out`."""
    from t1.view import sources

    records, _ = sources.read_jsonl_from(run_log, 0)
    steps: list[StepRecord] = []
    db = trainer_dir / sources.BUFFER_DB if trainer_dir is not None else None
    if db is not None and db.exists():
        try:
            steps = sources.buffer_steps(db)
        except (sqlite3.Error, ValueError):  # unreadable buffer: the run log's trainer records stand in
            steps = []
    return draw_png(learning_charts(records, steps, sft_curve), out, title)


def read_panels(png: Path) -> list[dict[str, Any]]:
    """The panel index stored in a PNG this module wrote (its Description text chunk)."""
    data = png.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{png} is not a PNG file")
    pos = 8
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind in (b"tEXt", b"iTXt") and body.startswith(b"Description\x00"):
            text = body.split(b"\x00", 1)[1]
            if kind == b"iTXt":  # compression flag, method, language tag, translated keyword
                text = text[2:].split(b"\x00", 2)[2]
            return list(json.loads(text.decode()))
        pos += 12 + length
    raise ValueError(f"{png} has no panel index (Description chunk)")
