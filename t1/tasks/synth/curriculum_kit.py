"""What the curriculum's families share: the vocabularies of their values, the verifier script's frame, the family type.

The learnable curriculum (`t1.tasks.synth.curriculum`) and its long tier (`t1.tasks.synth.long_tier`)
draw their names and values from here.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from t1.tasks.synth.base import SynthTask

# Every role has its own small vocabulary of whole words (one token each with the learn tokenizer), and
# files sit in the shell's working directory (/app): what a policy must carry is a token of a known kind
# that only the instruction or the machine shows, which a model of this size can learn to copy.
FILES = ("alpha", "beta", "gamma", "delta", "omega", "cedar", "maple", "river", "stone", "ember")
TARGETS = ("red", "blue", "green", "pink", "gold", "gray", "black", "white", "brown", "cyan")
CODES = ("apple", "lemon", "mango", "olive", "pearl", "plum", "grape", "peach", "melon", "berry")
DIRS = ("data", "notes", "inbox", "store", "vault", "cache", "drop", "box")
FOLDERS = ("north", "south", "east", "west", "up", "down", "left", "right")
WORDS = ("cow", "dog", "fox", "owl", "bee", "ant", "elk", "yak", "emu", "bat")
TOOLS = ("build", "deploy", "sync", "check", "render", "index", "backup", "report")
CONFS = ("main", "base", "core", "site", "user", "net", "disk", "auth")
EXTS = ("txt", "log", "csv", "cfg", "dat")


CHECKS_HEADER = """#!/bin/bash
# Verifier: one entry per check in /logs/verifier/reward.json (1 passed, 0 failed).
mkdir -p /logs/verifier
R=""
check() { local name=$1; shift; if ( "$@" ) >/dev/null 2>&1; then v=1; else v=0; fi; R="$R${R:+, }\\"$name\\": $v"; }
"""
CHECKS_FOOTER = 'echo "{$R}" > /logs/verifier/reward.json\n'

CurriculumFamily = Callable[[random.Random], SynthTask]


def code_word(rng: random.Random) -> str:
    """A value that is only in the machine's state: one of the code words."""
    return rng.choice(CODES)


def checks_script(*lines: str) -> str:
    """A verifier script (tests/test.sh) running one `check` per line and writing reward.json."""
    return CHECKS_HEADER + "".join(f"check {line}\n" for line in lines) + CHECKS_FOOTER
