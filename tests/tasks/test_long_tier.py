"""The curriculum's long tier: 12-40 commands a task, a value the first steps show that only a late step
uses, not in the instruction, and bash verifiers that the oracle resolves and an untouched sandbox does not,
in real sandboxes; each family's shortcut resolves exactly where the listing it reads is current."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from t1.config.tasks import TasksConfig, TaskSetConfig
from t1.sandbox.local.local_provider import LocalProvider
from t1.tasks.formats.dataset import load_dataset, load_named_set
from t1.tasks.synth.base import SynthTask, write_task
from t1.tasks.synth.curriculum import curriculum_plan, generate_curriculum, synthesize_curriculum
from t1.tasks.synth.long_tier import LONG_TIER, early_value
from t1.tasks.verify.oracle import RunMode, RunStatus, run_tasks

PLAN = curriculum_plan(3 * 40, 7, "train", LONG_TIER)


def _carried(family: str, turns: tuple[str, ...]) -> str:
    """The value the last command types, which only a command's output showed (staged_start's key and
    job_queue's ticket by the first command; file_chain's code by the last file, its target by the first)."""
    return turns[-1].split()[-1] if family == "staged_start" else turns[-1].split()[1]


@pytest.mark.parametrize("family", sorted(LONG_TIER))
def test_long_tasks_need_an_early_value_late(family: str) -> None:
    lengths, values = [], Counter[str]()
    for fam, seed in PLAN:
        if fam != family:
            continue
        task = generate_curriculum(fam, seed)
        lengths.append(len(task.turns))
        value = _carried(family, task.turns)
        assert value not in task.instruction, (value, task.instruction)
        values[value] += 1
        assert task.check_sh.count("\ncheck ") >= 3  # dense: the count rises step by step
    assert min(lengths) >= 12 and max(lengths) <= 40, (family, sorted(lengths))
    assert len(values) >= 6 and values.most_common(1)[0][1] <= 0.35 * sum(values.values()), values


def test_file_chain_target_is_shown_once_at_the_start() -> None:
    for fam, seed in PLAN:
        if fam == "file_chain":
            task = generate_curriculum(fam, seed)
            target = task.turns[-1].split("> ")[1].removesuffix(".txt")
            shows = [p for p, text in task.files.items() if f"target: {target}" in text]
            assert shows == [task.turns[0].split()[1]], (shows, task.turns[0])


def test_early_value_is_what_the_last_command_needs_from_the_first_output() -> None:
    for fam, seed in PLAN[:30]:
        task = generate_curriculum(fam, seed)
        last = task.turns[-1]
        wanted = last.split("> ")[1].removesuffix(".txt") if fam == "file_chain" else _carried(fam, task.turns)
        assert early_value(fam, task.files) == wanted, (fam, last)
    assert early_value("read_copy", {"a.txt": "target: x\n"}) is None  # not a long-tier family


def test_long_set_from_config(tmp_path: Path) -> None:
    cfg = TasksConfig(sets={"long": TaskSetConfig(path=tmp_path / "long", synth=3, synth_kind="long", split="eval")})
    specs = load_named_set(cfg, "long")
    assert sorted(s.metadata.family for s in specs) == sorted(LONG_TIER)


async def test_long_oracle_resolves_untouched_scores_zero(provider: LocalProvider, tmp_path: Path) -> None:
    specs = load_dataset([synthesize_curriculum(tmp_path, len(LONG_TIER), 3, "eval", families=LONG_TIER)[0].parent])
    oracle = await run_tasks(provider, specs, RunMode.ORACLE, concurrency=2)
    noop = await run_tasks(provider, specs, RunMode.VERIFY, concurrency=2)
    for o, n in zip(oracle, noop, strict=True):
        assert o.status is RunStatus.OK and o.resolved and o.reward == o.report.total >= 3, o.as_json()
        assert n.reward == 0 and not n.resolved, n.as_json()


def _listing_is_current(task: SynthTask) -> bool:
    """Whether the listing a long-tier task's shortcut rests on tells the truth (read against the robust turns)."""
    if task.family == "file_chain":  # index.txt names the chain's real end, the file the walk reads last
        return task.files["index.txt"] == f"end: {task.turns[-2].split()[1]}\n"
    if task.family == "job_queue":  # queue.txt is the queue itself
        return task.files["queue.txt"] == task.files[".queue"]
    return all(f"bash svc.sh {stage} {word}" in task.turns  # stages.txt's words are the ones each stage confirms
               for stage, word, _ in (line.split() for line in task.files["stages.txt"].splitlines()))


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(LONG_TIER))
async def test_shortcut_pays_only_with_a_current_listing(family: str, provider: LocalProvider,
                                                         tmp_path: Path) -> None:
    """Each family's shortcut (3-4 commands, a helper or a file trusted blind), run as the task's solution in a real
    sandbox, resolves exactly where the listing it rests on is current; a stale one leaves the task unresolved."""
    import random

    seeds = range(52, 64)
    current: dict[int, bool] = {}
    for seed in seeds:
        task = LONG_TIER[family](random.Random(seed))
        assert task.shortcut and len(task.shortcut) <= 4 and len(task.turns) >= 12
        current[seed] = _listing_is_current(task)
        write_task(dataclasses.replace(task, turns=task.shortcut), tmp_path / "short", f"{family}-{seed}",
                   "train", seed)
    assert set(current.values()) == {True, False}, current
    results = await run_tasks(provider, load_dataset([tmp_path / "short"]), RunMode.ORACLE, concurrency=2)
    for res in results:
        seed = int(res.task.rsplit("-", 1)[1])
        assert res.resolved is current[seed], res.as_json()
        if family == "file_chain" and not current[seed]:  # the target is there with the wrong code: one check of 3
            assert (res.report.passed, res.report.total) == (1, 3), res.as_json()
        if family == "job_queue" and not current[seed]:  # the ticket and the jobs whose listed value is current
            assert 1 <= res.report.passed < res.report.total, res.as_json()


def test_a_set_of_chosen_families_from_config(tmp_path: Path) -> None:
    from pydantic import ValidationError

    cfg = TasksConfig(sets={
        "one": TaskSetConfig(path=tmp_path / "one", synth=4, synth_kind="curriculum", synth_shortcut_copies=1,
                             synth_families=["retry_fetch"]),
        "two": TaskSetConfig(path=tmp_path / "two", synth=4, synth_kind="long",
                             synth_families=["job_queue", "file_chain"]),
        "typo": TaskSetConfig(path=tmp_path / "typo", synth=2, synth_kind="curriculum", synth_families=["file_chain"]),
    })
    one = load_named_set(cfg, "one")
    assert {s.metadata.family for s in one} == {"retry_fetch"} and len(one) == 8  # 4 robust, 4 shortcut copies
    assert sorted(s.metadata.family for s in load_named_set(cfg, "two")) == ["file_chain"] * 2 + ["job_queue"] * 2
    with pytest.raises(ValueError, match=r"tasks.sets.typo.synth_families names \['file_chain'\], not families of "
                                         r"synth_kind 'curriculum' \(known: count_match, fix_error"):
        load_named_set(cfg, "typo")
    assert not (tmp_path / "typo").exists()  # nothing half-written
    with pytest.raises(ValidationError, match=r"synth_families is \['x'\] but synth_kind is 'ood'"):
        TaskSetConfig(path=tmp_path, synth=2, synth_families=["x"])
