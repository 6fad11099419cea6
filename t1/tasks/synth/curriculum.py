"""The learnable curriculum: short multi-turn shell tasks a CPU-sized MoE can learn, with bash verifiers.

Every family needs at least two commands, and at least one of them reads machine state that is
only in a file, a listing or a command's output (a code, a file name, a count, a name in an error
message); the policy must carry that value, and the paths the instruction names, into its next
command. Values vary per seed in length and format, so no family has a constant answer. The
oracle types one command per turn (`SynthTask.turns`), as a policy would, and its demonstration
shows the output each later command depends on.

Verifiers are `tests/test.sh` scripts that write /logs/verifier/reward.json with one entry per
check (1 passed, 0 failed): milliseconds per run where a pytest run costs about 1.8 s.
`synthesize_curriculum(out, n, seed, split)` mirrors `t1.tasks.synth.synthesize`: families in
round-robin, task seeds from `task_seed`, so train and eval seeds are disjoint.

Three families have a shortcut (`SynthTask.shortcut`): a step skipped, right only when state the
instruction does not show allows it (a file without a label, a config already there, a tool that
answered the first call). Two teachers of mixed quality demonstrate them, and since only resolved
demonstrations are kept, SFT learns both ways at a rate that reward alone can tell apart: what RL adds
beyond imitation.
- `synthesize_curriculum(shortcut_copies=k)`, both ways: every task with a shortcut is typed once
  robustly and k more times with its shortcut (folders `<id>-s0`..), so the same instruction is seen
  done both ways and SFT learns a mixture of the two for every task. PPO needs that: a group's attempts
  must differ for its advantages to tell the ways apart.
- `synthesize_curriculum(shortcuts=s)`, one way per task: a share s of the tasks (drawn from the task
  seed) type the shortcut. A policy SFT'd on it makes a choice keyed on the task's words, the same in
  most of a task's attempts (docs/learning.md).
"""

from __future__ import annotations

import random
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from t1.tasks.synth.base import SynthTask, write_task
from t1.tasks.synth.curriculum_kit import (
    CONFS,
    DIRS,
    EXTS,
    FILES,
    FOLDERS,
    TARGETS,
    TOOLS,
    WORDS,
    CurriculumFamily,
    checks_script,
    code_word,
)
from t1.tasks.synth.long_tier import LONG_TIER

CONFIG_PRESENT_PERCENT = 40  # fix_error tasks whose script already has what it needs
BUSY_PERCENT = 60  # how often retry_fetch's tool answers "busy"

def _task(family: str, instruction: str, files: dict[str, str], checks: str, turns: list[str],
          setup: str = "", executable: tuple[str, ...] = (), shortcut: list[str] | None = None) -> SynthTask:
    return SynthTask(family=family, difficulty="easy", category="curriculum", instruction=instruction,
                     files=files, setup=setup, executable=executable, check_sh=checks, turns=tuple(turns),
                     shortcut=tuple(shortcut or ()), agent_timeout_sec=120.0, verifier_timeout_sec=30.0)


def read_copy(rng: random.Random) -> SynthTask:
    """A code only in a file goes into another file (read, then write the value seen).

    Half the files label their code (`code: apple`): the shortcut, a blind `cp`, is right for the others only,
    and a copied label passes only the first check (the file is there), as a failed shortcut does elsewhere.
    """
    src, out, code = rng.choice(FILES), rng.choice(TARGETS), code_word(rng)
    labelled = rng.randrange(2) == 0
    instruction = f"The file {src}.txt holds a code. Write that code to {out}.txt."
    checks = checks_script(f"target_exists test -f /app/{out}.txt",
                     f"code_written grep -qx {code} /app/{out}.txt",
                     f"code_alone test \"$(cat /app/{out}.txt)\" = {code}")
    return _task("read_copy", instruction, {f"{src}.txt": f"code: {code}\n" if labelled else code + "\n"}, checks,
                 [f"cat {src}.txt", f"echo {code} > {out}.txt"], shortcut=[f"cp {src}.txt {out}.txt"])


def pick_file(rng: random.Random) -> SynthTask:
    """One file of a listing has the named extension: move it (list, then move the name seen)."""
    box, dest = rng.choice(DIRS), rng.choice(FOLDERS)
    ext, *others = rng.sample(EXTS, 3)
    stems = rng.sample(FILES, 3)
    wanted = f"{stems[0]}.{ext}"
    files = {f"{box}/{wanted}": code_word(rng) + "\n"}
    for stem, other in zip(stems[1:], others, strict=True):
        files[f"{box}/{stem}.{other}"] = code_word(rng) + "\n"
    instruction = f"One file in {box} ends in .{ext}. Move it into the folder {dest}."
    checks = checks_script(f"moved_in test -f /app/{dest}/{wanted}",
                     f"moved_out test ! -e /app/{box}/{wanted}",
                     f"others_stay test \"$(ls /app/{box} | wc -l)\" -eq {len(files) - 1}")
    return _task("pick_file", instruction, files, checks,
                 [f"ls {box}", f"mv {box}/{wanted} {dest}"], setup=f"mkdir -p /app/{dest}\n")


def count_match(rng: random.Random) -> SynthTask:
    """A number only a command's output tells (count matching lines), written where asked."""
    log, out = rng.choice(FILES), rng.choice(TARGETS)
    word, *noise = rng.sample(WORDS, 3)
    n = rng.randint(1, 9)
    lines = [f"{word} {rng.randint(10, 99)}" for _ in range(n)] + [f"{rng.choice(noise)} {rng.randint(10, 99)}"
                                                          for _ in range(rng.randint(1, 6))]
    rng.shuffle(lines)
    instruction = f"Count the lines of {log}.log that contain {word}. Write the number to {out}.txt."
    checks = checks_script(f"target_exists test -f /app/{out}.txt",
                     f"count_written grep -qx {n} /app/{out}.txt")
    return _task("count_match", instruction, {f"{log}.log": "\n".join(lines) + "\n"}, checks,
                 [f"grep -c {word} {log}.log", f"echo {n} > {out}.txt"])


def fix_error(rng: random.Random) -> SynthTask:
    """A script may fail with an error naming a missing file: create it if so, then run the script again.

    Some tasks already have the file (CONFIG_PRESENT_PERCENT): the shortcut, saving the first run's output
    without looking at it, is right for those only.
    """
    tool, conf, out = rng.choice(TOOLS), rng.choice(CONFS), rng.choice(TARGETS)
    token = code_word(rng)
    present = rng.randrange(100) < CONFIG_PRESENT_PERCENT
    script = (f"#!/bin/bash\nif [ ! -f /app/{conf}.cfg ]; then echo \"error: missing {conf}.cfg\"; "
              f"exit 1; fi\necho ok {token}\n")
    instruction = f"Run {tool}.sh and save its output in {out}.log. Fix what it needs first."
    checks = checks_script(f"config_made test -f /app/{conf}.cfg",
                     f"output_saved test -f /app/{out}.log",
                     f"output_ok grep -qx {shlex.quote('ok ' + token)} /app/{out}.log")
    files = {f"{tool}.sh": script, **({f"{conf}.cfg": "ready=1\n"} if present else {})}
    fix = [] if present else [f"touch {conf}.cfg"]
    return _task("fix_error", instruction, files, checks, [f"bash {tool}.sh", *fix, f"bash {tool}.sh > {out}.log"],
                 executable=(f"{tool}.sh",), shortcut=[f"bash {tool}.sh > {out}.log"])


def retry_fetch(rng: random.Random) -> SynthTask:
    """A tool that is often busy hands out a code: call it with `--wait` (it waits until it can answer), then
    write the code where asked.

    The shortcut calls it without `--wait`, right only when that call happened to answer (100 - BUSY_PERCENT
    in 100). The wait is the tool's own, so a mistyped name fails at once where a shell loop would spin. It
    prints `code: X`, so the value the echo needs is the token it printed (` X`), not a line-initial `X`, a
    different token with the byte-level tokenizer that a model of this size did not learn to map for numbers.
    """
    tool, out, code = rng.choice(TOOLS), rng.choice(TARGETS), code_word(rng)
    script = (f"#!/bin/bash\nwhile [ $((RANDOM % 100)) -lt {BUSY_PERCENT} ]; do\n"
              f"  if [ \"$1\" != --wait ]; then echo \"{tool} is busy (--wait waits for it)\"; exit 1; fi\n"
              f"  sleep 0.1\ndone\ntouch /app/.{tool}-answered\necho \"code: {code}\"\n")
    instruction = f"Get the code from {tool}.sh and write it to {out}.txt."
    checks = checks_script(f"answered test -f /app/.{tool}-answered",
                     f"code_written grep -qx {code} /app/{out}.txt",
                     f"one_line test \"$(wc -l < /app/{out}.txt)\" -eq 1")
    return _task("retry_fetch", instruction, {f"{tool}.sh": script}, checks,
                 [f"bash {tool}.sh --wait", f"echo {code} > {out}.txt"], executable=(f"{tool}.sh",),
                 shortcut=[f"bash {tool}.sh", f"echo {code} > {out}.txt"])


CURRICULUM: dict[str, CurriculumFamily] = {
    "read_copy": read_copy,
    "pick_file": pick_file,
    "count_match": count_match,
    "fix_error": fix_error,
    "retry_fetch": retry_fetch,
}


def curriculum_plan(n: int, seed: int, split: str, families: Mapping[str, CurriculumFamily] = CURRICULUM
                    ) -> list[tuple[str, int]]:
    """(family, task seed) for n tasks, families in round-robin; seeds as `t1.tasks.synth.task_seed`."""
    from t1.tasks.synth import task_seed

    names = sorted(families)
    return [(names[i % len(names)], task_seed(seed, i, split)) for i in range(n)]


def generate_curriculum(family: str, seed: int) -> SynthTask:
    """One task of a family of the curriculum or of its long tier."""
    make = CURRICULUM.get(family) or LONG_TIER.get(family)
    if make is None:
        raise KeyError(f"no curriculum family {family!r} (known: {', '.join(sorted({**CURRICULUM, **LONG_TIER}))})")
    return make(random.Random(seed))


def shortcut_typed(task: SynthTask) -> SynthTask:
    """The task with its shortcut as the typed turns (solution/turns.txt); solve.sh keeps the robust turns."""
    return replace(task, turns=task.shortcut, solve=task.solve or "\n".join(task.turns))


def teacher_turns(task: SynthTask, seed: int, shortcuts: float) -> SynthTask:
    """The task as a teacher of mixed quality demonstrates it: its shortcut typed in a `shortcuts` share of
    tasks (drawn from the task seed), the robust turns otherwise; solve.sh runs the robust turns either way."""
    if not task.shortcut or random.Random(f"teacher-{seed}").random() >= shortcuts:
        return task
    return shortcut_typed(task)


def synthesize_curriculum(out: str | Path, n: int, seed: int = 0, split: str = "train",
                          shortcuts: float = 0.0, shortcut_copies: int = 0,
                          families: Mapping[str, CurriculumFamily] = CURRICULUM) -> list[Path]:
    """Write n curriculum tasks under `out`; returns their folders' paths in plan order.

    The typed turns (solution/turns.txt, what the scripted oracle types) make the demonstrations:
    `shortcut_copies` k > 0: each task with a shortcut also gets k folders `<id>-s<j>` typing it (both ways);
    else `shortcuts`: the share of tasks whose typed turns are the family's shortcut (one way per task).
    `families`: the curriculum's (default) or its long tier's (`t1.tasks.synth.long_tier.LONG_TIER`).
    """
    if shortcuts and shortcut_copies:
        raise ValueError("shortcuts and shortcut_copies are two teachers: give one of them")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for family, tseed in curriculum_plan(n, seed, split, families):
        task, task_id = generate_curriculum(family, tseed), f"{family}-{split}-{tseed}"
        paths.append(write_task(teacher_turns(task, tseed, shortcuts), root, task_id, split, tseed))
        if task.shortcut:
            paths += [write_task(shortcut_typed(task), root, f"{task_id}-s{j}", split, tseed)
                      for j in range(shortcut_copies)]
    return paths


def curriculum_texts(n: int = 200, seed: int = 0) -> Iterator[str]:
    """Instructions and oracle commands (robust and shortcut) of a curriculum (for training a tokenizer on it)."""
    for family, tseed in curriculum_plan(n, seed, "train"):
        task = generate_curriculum(family, tseed)
        yield task.instruction
        yield from task.turns
        yield from task.shortcut


def long_tier_texts(n: int = 200, seed: int = 0) -> Iterator[str]:
    """Instructions, commands and the text files of the long tier's training split (for a tokenizer)."""
    for family, tseed in curriculum_plan(n, seed, "train", LONG_TIER):
        task = generate_curriculum(family, tseed)
        yield task.instruction
        yield from task.turns
        yield from task.shortcut
        yield from (text for path, text in task.files.items() if path not in task.executable)

