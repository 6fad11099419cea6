"""bench/decode_batching.py, tiny: both backends decode every session; only KV slots batch unequal lengths."""

from __future__ import annotations

from pathlib import Path

from bench.decode_batching import MODES, parse_args, print_table, run


async def test_slots_batch_unequal_sessions_and_grouping_does_not(tiny_model_dir: Path, capsys) -> None:
    args = parse_args(["--model", str(tiny_model_dir), "--sessions", "3", "--repeats", "1", "--new-tokens", "6",
                       "--min-prompt", "10", "--max-prompt", "40", "--episode-turns", "2", "--tool-ms", "1"])
    args.model_made = False
    result = await run(args)
    (row,) = result["rows"]
    assert row["sessions"] == 3 and row["threads"] == 1
    for mode in MODES:
        assert row[mode]["decode_tokens_per_s"] > 0 and row[mode]["episodes_tokens_per_s"] > 0
    assert row["slots"]["mean_rows_per_decode_forward"] > 2, "sessions of unequal length were not batched"
    assert row["grouped"]["mean_rows_per_decode_forward"] == 1.0, "prompts of unequal length were grouped"
    print_table(result)
    assert "episodes: 2 turns per session" in capsys.readouterr().out
