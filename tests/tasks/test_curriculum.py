"""The learnable curriculum: multi-turn structure, values only the machine shows, disjoint splits, and its bash
verifiers (one reward.json entry per check) against the oracle and an untouched sandbox in real sandboxes."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from t1.agent.scripted import oracle_actions
from t1.sandbox.local.local_provider import LocalProvider
from t1.tasks.formats.dataset import load_dataset
from t1.tasks.synth.base import write_task
from t1.tasks.synth.curriculum import (
    CURRICULUM,
    curriculum_plan,
    generate_curriculum,
    synthesize_curriculum,
)
from t1.tasks.verify.oracle import RunMode, RunStatus, run_tasks
from t1.tasks.verify.report import VerifierReport
from t1.tasks.verify.verifier import uses_toolchain


def _hidden_value(family: str, turns: tuple[str, ...]) -> str | None:
    """The value a later turn carries that only an earlier command's output showed (None: fix_error's script had
    what it needed, which only its first run's output showed)."""
    last = turns[-1]
    if family in ("read_copy", "count_match", "retry_fetch"):
        return last.split()[1]                     # echo VALUE > target
    if family == "pick_file":
        return last.split("mv ")[1].split()[0].rsplit("/", 1)[1]  # the file name the listing showed
    assert family == "fix_error"
    return turns[1].split()[1] if turns[1].startswith("touch ") else None  # touch NAME.cfg, named by the error


@pytest.mark.parametrize("family", sorted(CURRICULUM))
def test_every_task_needs_state_it_must_read(family: str) -> None:
    values: Counter[str] = Counter()
    tasks = 0
    for fam, seed in curriculum_plan(5 * 40, 5, "train"):
        if fam != family:
            continue
        tasks += 1
        task = generate_curriculum(fam, seed)
        assert len(task.turns) >= 2, task
        value = _hidden_value(family, task.turns)
        if value is None:
            continue
        assert value not in task.instruction, (value, task.instruction)
        values[value] += 1
        assert task.check_sh.count("\ncheck ") >= 2  # several checks: the count reward is dense
    # no constant answer: every value of its role's vocabulary turns up, none dominates (a count is 1-9, a
    # config name one of 8, a code or a listed file name one of dozens)
    assert sum(values.values()) >= 0.5 * tasks, f"{family}: most of {tasks} tasks carry no value"
    assert len(values) >= 8 and values.most_common(1)[0][1] <= 0.3 * sum(values.values()), \
        f"{family}: answers over 40 tasks: {values}"


def test_splits_disjoint_and_deterministic(tmp_path: Path) -> None:
    train = [s for _, s in curriculum_plan(200, 1, "train")]
    heldout = [s for _, s in curriculum_plan(200, 2, "eval")]
    assert not set(train) & set(heldout)
    a = synthesize_curriculum(tmp_path / "a", 4, 1, "eval")
    b = synthesize_curriculum(tmp_path / "b", 4, 1, "eval")
    for x, y in zip(a, b, strict=True):
        assert x.name == y.name
        assert sorted(p.read_bytes() for p in x.rglob("*") if p.is_file()) == \
            sorted(p.read_bytes() for p in y.rglob("*") if p.is_file())


def test_oracle_types_one_command_per_turn(tmp_path: Path) -> None:
    specs = load_dataset([synthesize_curriculum(tmp_path, 4, 1, "train")[0].parent])
    for spec in specs:
        turns = spec.phases()[0].solution.turns  # type: ignore[union-attr]
        assert oracle_actions(spec) == [*turns, None]
        assert not uses_toolchain(spec.phases()[0].verifier)  # bash checks: no python toolchain upload


def test_reward_json_entries_are_checks() -> None:
    report = VerifierReport(reward_values=(("made", 1.0), ("value", 0.0), ("lines", 1.0)))
    assert (report.passed, report.total, report.resolved) == (2, 3, False)
    assert "value" in report.why
    full = VerifierReport(reward_values=(("made", 1.0), ("value", 1.0)))
    assert (full.passed, full.total, full.resolved) == (2, 2, True)
    # a `reward` key keeps its Harbor meaning: one reward, not checks
    assert VerifierReport(reward_values=(("reward", 0.5), ("x", 1.0))).total == 1


async def test_oracle_resolves_untouched_scores_zero(provider: LocalProvider, tmp_path: Path) -> None:
    specs = load_dataset([synthesize_curriculum(tmp_path, len(CURRICULUM), 3, "eval")[0].parent])
    assert sorted(s.metadata.family for s in specs) == sorted(CURRICULUM)
    oracle = await run_tasks(provider, specs, RunMode.ORACLE, concurrency=2)
    noop = await run_tasks(provider, specs, RunMode.VERIFY, concurrency=2)
    for o, n in zip(oracle, noop, strict=True):
        assert o.status is RunStatus.OK and o.resolved and o.reward == o.report.total >= 2, o.as_json()
        assert n.reward == 0 and not n.resolved, n.as_json()


def _hidden_state_allows_shortcut(family: str, seed: int) -> bool | None:
    """Whether the task's state lets its shortcut resolve (None: luck, retry_fetch's tool answers at random)."""
    task = generate_curriculum(family, seed)
    if family == "read_copy":
        return not next(iter(task.files.values())).startswith("code: ")
    assert family == "fix_error"
    return any(name.endswith(".cfg") for name in task.files)


async def test_shortcuts_resolve_only_when_hidden_state_allows(provider: LocalProvider, tmp_path: Path) -> None:
    """Each shortcut, run as the task's solution in a real sandbox, resolves exactly where the state the
    instruction does not show allows it, and passes one check of three where it does not; retry_fetch's single
    call fails on some attempts and its robust loop on none. The robust turns resolve everywhere
    (test_oracle_resolves_untouched_scores_zero)."""
    plan = [(f, s) for f, s in curriculum_plan(60, 6, "train") if f in ("read_copy", "fix_error")][:12]
    allows = {s: _hidden_state_allows_shortcut(f, s) for f, s in plan}
    assert set(allows.values()) == {True, False}, allows
    retry = [(f, s) for f, s in curriculum_plan(60, 6, "train") if f == "retry_fetch"][:1] * 12
    for i, (family, seed) in enumerate(plan + retry):
        task = generate_curriculum(family, seed)
        assert task.shortcut and task.shortcut != task.turns
        write_task(dataclasses.replace(task, turns=task.shortcut), tmp_path / "short", f"{family}-{seed}-{i}",
                   "train", seed)
        write_task(task, tmp_path / "robust", f"{family}-{seed}-{i}", "train", seed)
    short = await run_tasks(provider, load_dataset([tmp_path / "short"]), RunMode.ORACLE, concurrency=2)
    robust = await run_tasks(provider, load_dataset([tmp_path / "robust"]), RunMode.ORACLE, concurrency=2)
    for res in short:
        family, seed, _ = res.task.rsplit("-", 2)
        if family != "retry_fetch":
            assert res.resolved is allows[int(seed)], res.as_json()
        if family != "retry_fetch" and not res.resolved:  # one check of three: the count reward tells it apart
            assert (res.report.passed, res.report.total) == (1, 3), res.as_json()
    # the tool answers 40 in 100 calls: 12 single calls all answered has probability 0.4**12 (2e-5)
    assert 0 < sum(r.resolved for r in short if r.task.startswith("retry_fetch")) < 12
    assert all(r.resolved for r in robust), [r.as_json() for r in robust if not r.resolved]


def test_teacher_of_mixed_quality(tmp_path: Path) -> None:
    """`shortcuts` is the share of demonstrations typing the shortcut (drawn per task seed, so every split and
    rerun agrees); solve.sh is the robust path either way, and 0 leaves every task robust."""
    paths = synthesize_curriculum(tmp_path / "mixed", 200, 1, "train", shortcuts=0.75)
    plain = synthesize_curriculum(tmp_path / "plain", 200, 1, "train")
    typed = {True: 0, False: 0}
    for mixed, robust, (family, seed) in zip(paths, plain, curriculum_plan(200, 1, "train"), strict=True):
        task = generate_curriculum(family, seed)
        turns = (mixed / "solution" / "turns.txt").read_text().splitlines()
        assert (robust / "solution" / "turns.txt").read_text().splitlines() == list(task.turns)
        assert (mixed / "solution" / "solve.sh").read_text() == (robust / "solution" / "solve.sh").read_text()
        if task.shortcut:
            typed[tuple(turns) == task.shortcut] += 1
        else:
            assert turns == list(task.turns)
    assert 0.65 < typed[True] / (typed[True] + typed[False]) < 0.85, typed


def test_teacher_shows_each_task_both_ways(tmp_path: Path) -> None:
    """`shortcut_copies` k: a task with a shortcut is typed robustly in its own folder and with its shortcut in k
    more (the same instruction, files and checks, so the same words are seen done both ways); a task without one
    has one folder; solve.sh is the robust path in all of them."""
    paths = synthesize_curriculum(tmp_path / "both", 20, 1, "train", shortcut_copies=3)
    plan = curriculum_plan(20, 1, "train")
    with_shortcut = [(f, s) for f, s in plan if generate_curriculum(f, s).shortcut]
    assert len(paths) == len(plan) + 3 * len(with_shortcut) and 0 < len(with_shortcut) < len(plan)
    by_id = {p.name: p for p in paths}
    for family, seed in plan:
        task, task_id = generate_curriculum(family, seed), f"{family}-train-{seed}"
        robust = by_id[f"{task_id}"]
        copies = [by_id[f"{task_id}-s{j}"] for j in range(3)] if task.shortcut else []
        assert not task.shortcut or f"{task_id}-s3" not in by_id
        assert (robust / "solution" / "turns.txt").read_text().splitlines() == list(task.turns)
        for folder in copies:
            assert (folder / "solution" / "turns.txt").read_text().splitlines() == list(task.shortcut)
            for same in ("instruction.md", "solution/solve.sh", "tests/test.sh"):
                assert (folder / same).read_text() == (robust / same).read_text(), same
    with pytest.raises(ValueError, match="two teachers"):
        synthesize_curriculum(tmp_path / "two", 5, 1, "train", shortcuts=0.5, shortcut_copies=1)


def test_shortcuts_are_refused_outside_the_curriculum(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from t1.config.tasks import TaskSetConfig

    with pytest.raises(ValidationError, match=r"synth_shortcuts is 0\.5 but synth_kind is 'ood'"):
        TaskSetConfig(path=tmp_path, synth=4, synth_shortcuts=0.5)
    with pytest.raises(ValidationError, match=r"synth_shortcut_copies is 2 but synth_kind is 'ood'"):
        TaskSetConfig(path=tmp_path, synth=4, synth_shortcut_copies=2)
    with pytest.raises(ValidationError, match=r"two teachers"):
        TaskSetConfig(path=tmp_path, synth=4, synth_kind="curriculum", synth_shortcuts=0.5, synth_shortcut_copies=2)
    assert TaskSetConfig(path=tmp_path, synth=4, synth_kind="curriculum", synth_shortcuts=0.5).synth_shortcuts == 0.5
