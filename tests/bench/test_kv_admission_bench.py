"""bench.kv_admission on a tiny setting: every setting runs every episode to its end, the simulated
server's KV capacity is reported and used, an overcommitted static cap evicts, and the plot is drawn."""

from __future__ import annotations

import json
from pathlib import Path

from bench.kv_admission import main, summary


def test_static_caps_and_kv_admission_all_finish_and_are_measured(tiny_model_dir: Path, tmp_path: Path) -> None:
    out, png = tmp_path / "kv.json", tmp_path / "kv.png"
    main(["--model", str(tiny_model_dir), "--episodes", "6", "--turns", "3", "--caps", "1,6",
          "--kv-capacity-tokens", "3000", "--prompt-tokens", "300", "--tool-tokens", "200", "--max-tokens", "60",
          "--pause-ms", "10", "--per-token-ms", "0.5", "--per-request-ms", "5", "--per-prefill-token-ms", "0.01",
          "--expected-context-tokens", "1200", "--sample-s", "0.05", "--out", str(out),
          "--plot", str(png)])
    report = json.loads(out.read_text())
    results = {r["setting"]: r for r in report["results"]}
    assert {s: (row["runs"], row["turns_per_s"]) for s, row in report["summary"].items()} == {
        s: (1, r["turns_per_s"]) for s, r in results.items()}
    assert set(results) == {"static cap 1", "static cap 6", "kv admission (cap 6)"}
    turns = {r["turns"] for r in results.values()}
    assert len(turns) == 1 and turns.pop() >= 12, "the same episodes (2-3 turns each) ran in every setting"
    assert results["static cap 1"]["slot_wait_s"] > 0
    # Finished episodes' caches are dropped too (the server does not know they ended); six growing contexts
    # overcommit 3000 tokens and drop the caches of episodes still running.
    assert results["static cap 6"]["evictions"] > results["static cap 1"]["evictions"]
    kv = results["kv admission (cap 6)"]
    assert kv["kv_wait_s"] > 0 and kv["evictions"] < results["static cap 6"]["evictions"]
    assert all(0 < r["kv_use_mean"] <= 1.0 for r in results.values())
    assert png.stat().st_size > 0


def test_the_summary_gives_each_settings_mean_least_and_most_over_its_repeats() -> None:
    def run(repeat: int, setting: str, rate: float) -> dict:
        return {"repeat": repeat, "setting": setting, "turns_per_s": rate, "admission_wait_s": 2.0 * repeat,
                "prefilled_tokens": 100 * (repeat + 1), "evictions": repeat, "kv_use_mean": 0.5}

    table = summary([run(0, "static cap 4", 4.0), run(0, "kv", 5.0), run(1, "static cap 4", 3.0), run(1, "kv", 6.0)])
    assert list(table) == ["static cap 4", "kv"]
    assert table["kv"] == {"runs": 2, "turns_per_s": 5.5, "turns_per_s_min": 5.0, "turns_per_s_max": 6.0,
                           "admission_wait_s": 1.0, "prefilled_tokens": 150.0, "evictions": 0.5, "kv_use_mean": 0.5}
