"""The OOD training corpus: Harbor-format tasks synthesized from parameterised families of terminal work.

Modules:
- base.py: SynthTask, and how it is written as a Harbor task folder
- families_build.py, families_dev.py, families_ops.py, families_text.py: the OOD families (builds and fixes,
  developer work, operations and long projects, files and text and data)
- words.py: the fixed vocabulary of synthesized names
- curriculum.py: the learnable curriculum: short multi-turn shell tasks with bash verifiers, its plan and
  teachers
- long_tier.py: the curriculum's long tier: 12-40 commands, a value shown early needed late
- curriculum_kit.py: what the curriculum and its long tier share: vocabularies, the verifier frame, the family
  type
- decontam.py: decontamination: training tasks that overlap benchmark tasks, by word n-grams and MinHash

`synthesize(out, n, seed, split)` writes n tasks, cycling through the families so
every family is represented, with difficulties mixed. Each task's own seed is
derived from (seed, index, split) with the split in its lowest bit, so seeds of
the train and eval splits never overlap. `corpus_texts` yields the instruction
and solution text of a corpus (for training a tokenizer on it).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

from t1.tasks.synth.base import Generator, SynthTask, write_task
from t1.tasks.synth.families_build import build_test, debug_script
from t1.tasks.synth.families_dev import git_repair, shell_scripting, sqlite_task
from t1.tasks.synth.families_ops import long_horizon, process_service
from t1.tasks.synth.families_text import data_conversion, files_perms, text_logs

FAMILIES: dict[str, Generator] = {
    "files_perms": files_perms,
    "text_logs": text_logs,
    "shell_scripting": shell_scripting,
    "git_repair": git_repair,
    "sqlite": sqlite_task,
    "build_test": build_test,
    "debug_script": debug_script,
    "data_conversion": data_conversion,
    "process_service": process_service,
    "long_horizon": long_horizon,
}
DIFFICULTIES = ("easy", "medium", "hard")
SPLITS = ("train", "eval")


def task_seed(seed: int, index: int, split: str) -> int:
    """The seed of one task; the lowest bit is the split, so train and eval seeds are disjoint."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if seed < 0 or index < 0:
        raise ValueError("seed and index must be >= 0")
    return ((seed * 1_000_003 + index) << 1) | SPLITS.index(split)


def generate(family: str, seed: int) -> SynthTask:
    """One task of a family from its task seed (deterministic)."""
    rng = random.Random(seed)
    difficulty = DIFFICULTIES[rng.randrange(len(DIFFICULTIES))]
    return FAMILIES[family](rng, difficulty)


def plan(n: int, seed: int, split: str) -> list[tuple[str, int]]:
    """(family, task seed) for n tasks: families in round-robin so any prefix is stratified."""
    names = sorted(FAMILIES)
    random.Random(seed).shuffle(names)
    return [(names[i % len(names)], task_seed(seed, i, split)) for i in range(n)]


def synthesize(out: str | Path, n: int, seed: int = 0, split: str = "train") -> list[Path]:
    """Write n Harbor task folders under `out`; returns their paths in plan order."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for family, tseed in plan(n, seed, split):
        paths.append(write_task(generate(family, tseed), root, f"{family}-{split}-{tseed}", split, tseed))
    return paths


def corpus_texts(n: int = 200, seed: int = 0, split: str = "train") -> Iterator[str]:
    """Instruction and solution texts of the corpus `synthesize(n, seed, split)` would write (no files)."""
    for family, tseed in plan(n, seed, split):
        task = generate(family, tseed)
        yield task.instruction
        if task.solution:
            yield task.solution
        for step in task.steps:
            yield step.instruction
            yield step.solution


__all__ = ["DIFFICULTIES", "FAMILIES", "corpus_texts", "generate", "plan", "synthesize", "task_seed"]
