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
"""

from __future__ import annotations

import random
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

from t1.tasks.synth.base import SynthTask, write_task

_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "cedar", "maple", "river", "stone", "ember", "frost",
          "amber", "coral", "lunar", "solar", "pixel", "vapor", "quartz", "nova", "orbit", "tango", "zephyr")
_DIRS = ("data", "notes", "inbox", "store", "vault", "cache", "drop", "box")
_EXTS = ("txt", "log", "csv", "cfg", "dat")
_HEX = "0123456789abcdef"

CHECKS_HEADER = """#!/bin/bash
# Verifier: one entry per check in /logs/verifier/reward.json (1 passed, 0 failed).
mkdir -p /logs/verifier
R=""
check() { local name=$1; shift; if ( "$@" ) >/dev/null 2>&1; then v=1; else v=0; fi; R="$R${R:+, }\\"$name\\": $v"; }
"""
CHECKS_FOOTER = 'echo "{$R}" > /logs/verifier/reward.json\n'

CurriculumFamily = Callable[[random.Random], SynthTask]


def _code(rng: random.Random) -> str:
    """A value of varying length and format: hex, word-number, or digits."""
    kind = rng.randrange(3)
    if kind == 0:
        return "".join(rng.choice(_HEX) for _ in range(rng.randint(3, 6)))
    if kind == 1:
        return f"{rng.choice(_WORDS)}{rng.randint(1, 99)}"
    return str(rng.randint(10, 99999))


def _names(rng: random.Random, k: int) -> list[str]:
    return rng.sample(_WORDS, k)


def _checks(*lines: str) -> str:
    return CHECKS_HEADER + "".join(f"check {line}\n" for line in lines) + CHECKS_FOOTER


def _task(family: str, instruction: str, files: dict[str, str], checks: str, turns: list[str],
          setup: str = "", executable: tuple[str, ...] = ()) -> SynthTask:
    return SynthTask(family=family, difficulty="easy", category="curriculum", instruction=instruction,
                     files=files, setup=setup, executable=executable, check_sh=checks, turns=tuple(turns),
                     agent_timeout_sec=120.0, verifier_timeout_sec=30.0)


def read_copy(rng: random.Random) -> SynthTask:
    """A code only in a file goes into another file (read, then write the value seen)."""
    folder, src, out = rng.choice(_DIRS), *_names(rng, 2)
    code = _code(rng)
    path, target = f"/app/{folder}/{src}.txt", f"/app/{out}.txt"
    instruction = f"The file {path} holds a code. Write that code to {target}."
    checks = _checks(f"target_exists test -f {target}",
                     f"code_written grep -qx {shlex.quote(code)} {target}",
                     f"one_line test \"$(wc -l < {target})\" -eq 1")
    return _task("read_copy", instruction, {f"{folder}/{src}.txt": code + "\n"}, checks,
                 [f"cat {path}", f"echo {code} > {target}"])


def pick_file(rng: random.Random) -> SynthTask:
    """One file of a listing has the named extension: move it (list, then move the name seen)."""
    box, dest = rng.sample(_DIRS, 2)
    ext, *others = rng.sample(_EXTS, 3)
    stems = _names(rng, 3)
    wanted = f"{stems[0]}{rng.randint(1, 99)}.{ext}"
    files = {f"{box}/{wanted}": _code(rng) + "\n"}
    for stem, other in zip(stems[1:], others, strict=True):
        files[f"{box}/{stem}{rng.randint(1, 99)}.{other}"] = _code(rng) + "\n"
    instruction = f"Exactly one file in /app/{box} ends in .{ext}. Move that file into the folder /app/{dest}."
    checks = _checks(f"moved_in test -f /app/{dest}/{wanted}",
                     f"moved_out test ! -e /app/{box}/{wanted}",
                     f"others_stay test \"$(ls /app/{box} | wc -l)\" -eq {len(files) - 1}")
    return _task("pick_file", instruction, files, checks,
                 [f"ls /app/{box}", f"mkdir -p /app/{dest} && mv /app/{box}/{wanted} /app/{dest}/"])


def count_match(rng: random.Random) -> SynthTask:
    """A number only a command's output tells (count matching lines), written where asked."""
    log, out = _names(rng, 2)
    word, *noise = _names(rng, 3)
    n = rng.randint(1, 9)
    lines = [f"{word} {_code(rng)}" for _ in range(n)] + [f"{rng.choice(noise)} {_code(rng)}"
                                                          for _ in range(rng.randint(1, 6))]
    rng.shuffle(lines)
    path, target = f"/app/{log}.log", f"/app/{out}.txt"
    instruction = f"Count the lines of {path} that contain the word {word}. Write the number to {target}."
    checks = _checks(f"target_exists test -f {target}",
                     f"count_written grep -qx {n} {target}")
    return _task("count_match", instruction, {f"{log}.log": "\n".join(lines) + "\n"}, checks,
                 [f"grep -c {word} {path}", f"echo {n} > {target}"])


def fix_error(rng: random.Random) -> SynthTask:
    """A script fails with an error naming a missing file: create it, then run the script again."""
    tool, conf, out = _names(rng, 3)
    token = _code(rng)
    script = (f"#!/bin/bash\nif [ ! -f /app/etc/{conf}.cfg ]; then echo \"error: missing /app/etc/{conf}.cfg\"; "
              f"exit 1; fi\necho ok {token}\n")
    instruction = f"Run /app/{tool}.sh and save its output in /app/{out}.log. Fix what it needs first."
    checks = _checks(f"config_made test -f /app/etc/{conf}.cfg",
                     f"output_saved test -f /app/{out}.log",
                     f"output_ok grep -qx {shlex.quote('ok ' + token)} /app/{out}.log")
    return _task("fix_error", instruction, {f"{tool}.sh": script}, checks,
                 [f"bash /app/{tool}.sh", f"touch /app/etc/{conf}.cfg", f"bash /app/{tool}.sh > /app/{out}.log"],
                 setup="mkdir -p /app/etc\n", executable=(f"{tool}.sh",))


CURRICULUM: dict[str, CurriculumFamily] = {
    "read_copy": read_copy,
    "pick_file": pick_file,
    "count_match": count_match,
    "fix_error": fix_error,
}


def curriculum_plan(n: int, seed: int, split: str) -> list[tuple[str, int]]:
    """(family, task seed) for n tasks, families in round-robin; seeds as `t1.tasks.synth.task_seed`."""
    from t1.tasks.synth import task_seed

    names = sorted(CURRICULUM)
    return [(names[i % len(names)], task_seed(seed, i, split)) for i in range(n)]


def generate_curriculum(family: str, seed: int) -> SynthTask:
    return CURRICULUM[family](random.Random(seed))


def synthesize_curriculum(out: str | Path, n: int, seed: int = 0, split: str = "train") -> list[Path]:
    """Write n curriculum task folders under `out`; returns their paths in plan order."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    return [write_task(generate_curriculum(family, tseed), root, f"{family}-{split}-{tseed}", split, tseed)
            for family, tseed in curriculum_plan(n, seed, split)]


def curriculum_texts(n: int = 200, seed: int = 0) -> Iterator[str]:
    """Instructions and oracle commands of a curriculum (for training a tokenizer on it)."""
    for family, tseed in curriculum_plan(n, seed, "train"):
        task = generate_curriculum(family, tseed)
        yield task.instruction
        yield from task.turns
