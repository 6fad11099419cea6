"""The viewer's index and pure parts without a browser: token roles by hand, the episodes query, transcripts,
following a live run (spool frames and run-log lines appended after the index was built), read-only access,
and the pages' answers to bad input (over real HTTP with Starlette's test client)."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from smoke_run import SMOKE_TIMEOUT, SmokeRun
from starlette.testclient import TestClient

from t1.agent.transcript import Transcript
from t1.coordinator.spool.trajectory_spool import Spool
from t1.trajectory.serialization import encode_trajectory
from t1.trajectory.types import EpisodeStatus, Segment, Trajectory, TurnSpan, VerifierSummary
from t1.view.episodes import EpisodeQuery, SortKey, group_advantages, run_query, task_family
from t1.view.index import RunIndex, RunPaths
from t1.view.server import create_app
from t1.view.tokens import TokenRole, routing_coverage, token_roles
from t1.view.transcripts import parse_transcript
from t1.view.vocab import NO_VOCAB

EOT = 2
SPECIAL = {1, 2}


def segment(
    ids: list[int], mask: list[bool], turns: tuple[TurnSpan, ...], routing: np.ndarray | None = None
) -> Segment:
    lp = np.where(mask, -0.5, np.nan).astype(np.float32)
    return Segment(np.asarray(ids, np.int32), lp, np.asarray(mask, bool),
                   np.where(mask, 3, -1).astype(np.int32), routing, turns)


def trajectory(
    tid: str, group: str, attempt: int, reward: float, status: EpisodeStatus = EpisodeStatus.OK
) -> Trajectory:
    seg = segment([1, 10, 11, 2, 20, 21, 2, 1, 30], [False, False, False, False, True, True, True, False, True],
                  (TurnSpan(4, 7, 0.5), TurnSpan(8, 9, 1.0)))
    return Trajectory(tid, "sqlite-train-7", group, attempt, (seg,), reward, status, VerifierSummary(1, 2))


def test_token_roles_by_hand() -> None:
    # prompt: <s> 10 11 </s>; turn 0 sampled 20 21 </s>; template <s>; turn 1 sampled 30 without </s>: repaired
    seg = segment([1, 10, 11, 2, 20, 21, 2, 1, 30, 2, 40, 41],
                  [False, False, False, False, True, True, True, False, True, False, False, False],
                  (TurnSpan(4, 7), TurnSpan(8, 9)))
    L, R, T, P, Ob = (TokenRole.LOSS, TokenRole.REPAIRED, TokenRole.TEMPLATE, TokenRole.PROMPT,
                      TokenRole.OBSERVATION)
    assert token_roles(seg, [EOT], SPECIAL) == [T, P, P, T, L, L, L, T, L, R, Ob, Ob]
    # without a vocabulary: only the mask and the prompt boundary are known
    assert token_roles(seg) == [P, P, P, P, L, L, L, Ob, L, Ob, Ob, Ob]


def test_routing_coverage_counts_sentinel_layers() -> None:
    routing = np.zeros((3, 4, 2), np.uint8)
    routing[1, 0, :] = 255
    routing[2] = 255
    assert routing_coverage(routing) == [1.0, 0.75, 0.0]
    assert routing_coverage(None) == []


def test_query_filters_sorts_pages_and_rejects_bad_params(tmp_path: Path) -> None:
    assert task_family("sqlite-train-2000008") == "sqlite" and task_family("hello-world") == "hello-world"
    index = _live_index(tmp_path)
    rows = index.episodes
    page = run_query(rows, EpisodeQuery(sort=SortKey.REWARD, descending=False), page_size=2)
    assert [r.id for r in page.rows] == ["g1-a1", "g1-a2"] and page.num_pages == 2 and page.total == 3
    assert run_query(rows, EpisodeQuery(sort=SortKey.REWARD, page=9), page_size=2).page == 2
    assert [r.id for r in run_query(rows, EpisodeQuery(infra="yes")).rows] == ["g1-a2"]
    assert run_query(rows, EpisodeQuery(min_reward=0.5, version=3)).total == 1
    assert run_query(rows, EpisodeQuery(version=4)).total == 0
    with pytest.raises(ValueError, match="min_reward"):
        EpisodeQuery.from_params({"min_reward": "lots"})
    with pytest.raises(ValueError, match="sort"):
        EpisodeQuery.from_params({"sort": "id; drop"})
    with pytest.raises(ValueError, match="min_reward"):
        EpisodeQuery.from_params({"min_reward": "nan"})
    assert group_advantages([1.0, 0.0]) == [1.0, -1.0] and group_advantages([2.0, 2.0]) == [0.0, 0.0]


def _live_index(tmp_path: Path) -> RunIndex:
    """A run dir made by the real writers: a spool with three trajectories and a run log."""
    run = tmp_path / "run"
    import asyncio

    async def write() -> None:
        spool = Spool.open(run / "spool", 1 << 30, 1 << 20, fsync=False)
        for t in (trajectory("g1-a0", "g1", 0, 1.0), trajectory("g1-a1", "g1", 1, 0.0),
                  trajectory("g1-a2", "g1", 2, 0.0, EpisodeStatus.INFRA_ERROR)):
            await spool.append(t.id, encode_trajectory(t))
        spool.close()

    asyncio.run(write())
    (run / "run.jsonl").write_text(json.dumps({"ts": 1.0, "event": "start", "name": "t"}) + "\n")
    return RunIndex(RunPaths(run), refresh_s=0.0)


def test_index_follows_a_live_run_and_never_writes(tmp_path: Path) -> None:
    index = _live_index(tmp_path)
    run = index.paths.run_dir
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.rglob("*") if p.is_file()}
    assert [r.id for r in index.episodes] == ["g1-a0", "g1-a1", "g1-a2"]
    assert index.group("g1")[0].max_version == 3

    # the run goes on: a fourth trajectory is spooled, a transcript and a status record are written
    import asyncio

    async def more() -> None:
        spool = Spool.open(run / "spool", 1 << 30, 1 << 20, fsync=False)
        await spool.append("g2-a0", encode_trajectory(trajectory("g2-a0", "g2", 0, 2.0)))
        spool.close()

    after_build = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.rglob("*") if p.is_file()}
    assert after_build == before, "building the index changed the run directory"
    asyncio.run(more())
    tr = Transcript(run / "transcripts" / "train", "sqlite-train-7", "g2-a0")
    tr.turn(0, "<tool_call>ls</tool_call>", 3, 9, 3, "stop")
    tr.command("ls -la\nsecond line", "a\n````x\nb", 2, 0.25, True)
    tr.note("context compacted: new segment 1 starts with 5 tokens")
    tr.verifier("turn 1", 1, 2, "test_b failed")
    tr.close()
    index.refresh()
    assert index.transcript_path(index.episode("g2-a0")) == run / "transcripts/train/sqlite-train-7/g2-a0.md"
    assert index.transcript_path(index.episode("g1-a1")) is None
    # a later episode of the same task: its transcript lands in a folder the index has already seen
    Transcript(run / "transcripts" / "train", "sqlite-train-7", "g1-a1").close()
    with (run / "run.jsonl").open("a") as f:
        f.write(json.dumps({"ts": 2.0, "event": "status", "stage": "training", "turns_per_s": 1.5}) + "\n")
        f.write('{"ts": 3.0, "event": "sta')  # a line still being written is not read
    index.refresh()
    assert "g2-a0" in {r.id for r in index.episodes}
    assert index.transcript_path(index.episode("g1-a1")) == run / "transcripts/train/sqlite-train-7/g1-a1.md"
    assert [r["event"] for r in index.records] == ["start", "status"]


def test_transcript_parse_round_trip(tmp_path: Path) -> None:
    tr = Transcript(tmp_path, "task-1", "ep-1")
    tr.header("task-1", "ep-1", "tool_calls", "Do the thing.", 12)
    tr.turn(0, "reply zero", 3, 15, 1, "stop")
    tr.command("make test", "ok\n", 0, 1.5, False)
    tr.turn(1, "reply one", 2, 20, 2, "length")
    tr.command("sleep 999", "", None, 30.0, True)
    tr.note("context compacted: new segment 1 starts with 9 tokens")
    tr.verifier("final", 3, 5)
    tr.footer("ok", 3.0, 2, 20, 31.0, {1: 3.0})
    tr.close()
    p = parse_transcript((tmp_path / "task-1" / "ep-1.md").read_text())
    assert p.instruction == "Do the thing." and "task: task-1" in p.header
    assert [t.reply for t in p.turns] == ["reply zero", "reply one"]
    assert [(c.command, c.exit_code, c.timed_out, c.output) for t in p.turns for c in t.commands] == [
        ("make test", "0", False, "ok"), ("sleep 999", "None", True, "")]
    assert p.turns[1].notes == ["context compacted: new segment 1 starts with 9 tokens"]
    assert [(c.label, c.passed, c.total) for c in p.turns[1].checkpoints] == [("final", 3, 5)]
    assert "reward: 3" in p.result


def test_pages_answer_bad_input_with_errors_that_name_it(tmp_path: Path) -> None:
    index = _live_index(tmp_path)
    client = TestClient(create_app(index, NO_VOCAB), base_url="http://127.0.0.1")  # a name the viewer answers
    r = client.get("/episodes", params={"min_reward": "lots"})
    assert r.status_code == 400 and "min_reward=&#39;lots&#39; is not a float" in r.text
    r = client.get("/episodes/nope")
    assert r.status_code == 404 and "no episode &#39;nope&#39;" in r.text
    assert client.get("/groups/nope").status_code == 404
    assert client.get("/assets/../../etc/passwd").status_code == 404
    r = client.get("/episodes/g1-a0")
    assert r.status_code == 200 and r.text.count('class="tok role-loss" data-p=') == 4 and "#20" in r.text
    adv = client.get("/groups/g1").text
    assert "- (infra error)" in adv  # an infra error gets no advantage


@SMOKE_TIMEOUT
def test_index_of_the_smoke_run_lists_every_record(smoke_run: SmokeRun, tmp_path: Path) -> None:
    assert smoke_run.rc == 0, smoke_run.log[-4000:]
    run = tmp_path / "copy"
    shutil.copytree(smoke_run.run_dir, run)  # the trainer dir is found from the run log's weights records
    index = RunIndex(RunPaths(run))
    assert index.paths.trainer_dir == smoke_run.trainer_dir
    by_source: dict[str, int] = {}
    for r in index.episodes:
        by_source[r.source] = by_source.get(r.source, 0) + 1
        assert index.transcript_path(r) is not None, f"{r.id} has no transcript"
        assert not math.isnan(r.reward)
    report = json.loads((run / "report.json").read_text())
    evals = sum(v["heldout"]["num_tasks"] for k, v in report.items() if k in ("base", "warm_start", "rl"))
    assert by_source["eval"] == evals and by_source["train"] >= 2 and by_source["demo"] >= 1
    assert len(index.steps) == report["trainer"]["step"]


def test_t1_view_rejects_what_is_not_a_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from t1.cli.main import main

    assert main(["view", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["view", str(tmp_path)]) == 2
    assert "not a T1 run directory" in capsys.readouterr().err
    (tmp_path / "run.jsonl").write_text("")
    assert main(["view", str(tmp_path), "--port", "70000"]) == 2
    assert "--port 70000" in capsys.readouterr().err


def test_episode_whose_spool_file_was_acknowledged_is_read_from_the_trainer_buffer(tmp_path: Path) -> None:
    from t1.trainer.buffer import TrajectoryBuffer

    index = _live_index(tmp_path)
    index.paths = RunPaths(index.paths.run_dir, tmp_path / "trainer")
    client = TestClient(create_app(index, NO_VOCAB), base_url="http://127.0.0.1")  # a name the viewer answers
    assert index.episode("g1-a0").locator.path.suffix == ".spool"
    # the trainer accepts every record, then the spool deletes its fully acknowledged file
    buffer = TrajectoryBuffer(tmp_path / "trainer" / "buffer.sqlite")
    for t in (trajectory("g1-a0", "g1", 0, 1.0), trajectory("g1-a1", "g1", 1, 0.0)):
        buffer.add(t.id, t.group_id, encode_trajectory(t))
    buffer.close()
    for f in (index.paths.run_dir / "spool").glob("*.spool"):
        f.unlink()
    index.refresh_s = 1e9  # the page asks before the index's next refresh would have seen the change
    r = client.get("/episodes/g1-a0")
    assert r.status_code == 200 and r.text.count('class="tok role-loss" data-p=') == 4
    assert index.episode("g1-a0").locator.row_id == "g1-a0"
