"""bench/long_horizon.py's pure parts: which compaction summaries a later step needed and which carried the early
value (over transcripts the real writer wrote), the lowest routing replay coverage, and bench/learning.py's
compaction axis and its long-horizon lines."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from bench.learning import long_lines, run_config
from bench.long_horizon import SummaryTally, carry_of_job, long_stats, replay_coverage, summary_tally
from t1.agent.transcript import Transcript
from t1.config.loader import validate

ROOT = Path(__file__).resolve().parents[2]


def _episode(directory: Path, task_id: str, episode_id: str, key: str, summaries: list[str]) -> None:
    """A staged_start-shaped transcript: a summary before the key is shown (not needed), then `summaries` after."""
    tx = Transcript(directory, task_id, episode_id)
    tx.header(task_id, episode_id, "tool_calls", "Bring the service up with svc.sh.", 270)
    tx.note("compaction summary (9 tokens): I ran 0 commands.")
    tx.turn(1, "<tool_call>...</tool_call>", 20, 300, 0, "stop")
    tx.command("bash svc.sh init", f"init done, key: {key}\nnext stage: build\n", 0, 0.01, False)
    for text in summaries:
        tx.note(text)
    tx.close()


def test_summary_tally_counts_needed_carried_and_malformed(tmp_path: Path) -> None:
    _episode(tmp_path, "staged_start-eval-1", "e1", "mango", [
        "compaction summary (20 tokens): I ran 6 commands, the last: bash svc.sh sync. Values still needed: mango.",
        "compaction summary (12 tokens): I ran 9 commands, the last: bash svc.sh sync owl.",  # lossy
        "compaction summary (64 tokens, malformed: the rule note instead): I ran mango",      # malformed
        "compaction summary (8 tokens): the key is mangos",  # another word, not the value
    ])
    text = (tmp_path / "staged_start-eval-1" / "e1.md").read_text()
    # the first summary came before the key was shown: not needed; 3 well-formed after it, 1 carried it
    assert summary_tally(text, "mango") == SummaryTally(needed=3, carried=1, malformed=1)
    assert SummaryTally(3, 1, 1).as_dict() == {"needed": 3, "carried": 1, "carry_share": 1 / 3, "malformed": 1}
    assert SummaryTally().as_dict()["carry_share"] is None


def test_carry_of_job_reads_each_tasks_value_from_its_files(tmp_path: Path) -> None:
    tasks, job = tmp_path / "tasks", tmp_path / "transcripts"
    for task_id, key in (("staged_start-eval-1", "mango"), ("staged_start-eval-2", "olive")):
        files = tasks / task_id / "environment" / "files"
        files.mkdir(parents=True)
        (files / "svc.sh").write_text(f'  init) touch state/.init; echo "init done, key: {key}"; echo next ;;\n')
    _episode(job, "staged_start-eval-1", "a0", "mango", ["compaction summary (5 tokens): key mango"])
    _episode(job, "staged_start-eval-2", "a0", "olive", ["compaction summary (5 tokens): key lemon",
                                                          "compaction summary (5 tokens): key olive"])
    _episode(job, "read_copy-eval-3", "a0", "x", ["compaction summary (5 tokens): x"])  # not the long tier: skipped
    out = carry_of_job(job, tasks)
    assert (out["needed"], out["carried"], out["malformed"]) == (3, 2, 0)
    assert out["by_family"] == {"staged_start": {"needed": 3, "carried": 2, "carry_share": 2 / 3, "malformed": 0}}
    assert carry_of_job(tmp_path / "missing", tasks)["needed"] == 0


def test_replay_coverage_is_the_lowest_trainer_step(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    records = [{"event": "start"}, {"event": "trainer", "metrics": {}},
               {"event": "trainer", "metrics": {"t1_routing_replay_coverage": 1.0}},
               {"event": "trainer", "metrics": {"rl/t1_routing_replay_coverage": 0.75, "t1_kl": 0.1}}]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert replay_coverage(log) == 0.75
    assert replay_coverage(tmp_path / "none.jsonl") is None


def test_long_stats_and_their_lines(tmp_path: Path) -> None:
    report = {"rl": {"heldout": {"job_id": "job-1", "turns": {"median": 22.0, "p90": 31.0},
                                 "segments": {"median": 5.0, "p90": 8.0, "min": 3.0}}},
              "rollouts": {"segments": 120, "segments_with_drift": 0}, "fidelity": {"t1_tito_drift_tokens": 0}}
    stats = long_stats(tmp_path, report, tmp_path / "tasks", ("base", "rl"))
    assert list(stats["evals"]) == ["rl"] and stats["evals"]["rl"]["summaries"]["needed"] == 0
    assert (stats["segments"], stats["segments_with_drift"], stats["tito_drift_tokens"]) == (120, 0, 0)
    lines = long_lines(stats)
    assert "turns/episode 22.0 (p90 31.0), segments/episode 5.0 (p90 8.0, min 3.0)" in lines[0]
    assert lines[-1].startswith("    TITO drift: 0 tokens, 0 of 120 segments")


def test_the_compaction_axis_sets_the_mode_and_names_the_run(tmp_path: Path) -> None:
    base = yaml.safe_load((ROOT / "examples" / "long.yaml").read_text())
    cfg = run_config(base, tmp_path / "count-rule-s1", 1, "count", "rule")
    validate(cfg)
    assert cfg["rollout"]["compaction"]["mode"] == "rule" and cfg["name"] == "learning-count-rule-s1"
    assert base["rollout"]["compaction"]["mode"] == "policy"  # the example itself is untouched
    assert run_config(base, tmp_path / "x", 0, "count")["rollout"]["compaction"]["mode"] == "policy"
